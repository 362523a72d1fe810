"""The machine-wide checks of `trainmate doctor`: Python, torch, CUDA, GPUs, environment, CPU."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import psutil

from ..monitor import GpuReport
from ..monitor.host import cgroup_cpu_limit, cgroup_memory_limit, usable_cpus
from ..monitor.nvml import NvmlSource

Status = Literal["ok", "warn", "fail"]
GiB = 1024**3
# Docker gives containers 64 MiB of /dev/shm; DataLoader workers hand batches over through it and
# die with "bus error" / "unable to write to file </torch_...>" when it fills.
SHM_MIN_BYTES = 1 * GiB


@dataclass(frozen=True)
class Finding:
    """One check's answer: its status, what it saw, and one line of advice."""

    check: str
    status: Status
    value: str
    advice: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def _python() -> Finding:
    version = platform.python_version()
    status: Status = "ok" if sys.version_info >= (3, 10) else "warn"
    advice = "" if status == "ok" else "Python 3.10 or newer is needed by current torch releases"
    return Finding(
        "python",
        status,
        f"{version} ({platform.python_implementation()}, {sys.executable})",
        advice,
        {"version": version, "executable": sys.executable},
    )


def _torch_build(torch: ModuleType) -> Finding:
    cuda = torch.version.cuda
    hip = getattr(torch.version, "hip", None)
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU"
    return Finding(
        "torch",
        "ok",
        f"{torch.__version__} ({build} build)",
        "",
        {"version": torch.__version__, "build": build, "cuda": cuda},
    )


def _cuda(torch: ModuleType, nvml: GpuReport) -> Finding:
    cuda_build = torch.version.cuda
    available = bool(torch.cuda.is_available())
    data = {"available": available, "device_count": torch.cuda.device_count() if available else 0}
    if available:
        value = f"yes, {data['device_count']} device(s), CUDA runtime {cuda_build}"
        if (
            nvml.available
            and cuda_build
            and _version_tuple(nvml.cuda_driver_version) < _version_tuple(cuda_build)
        ):
            return Finding(
                "cuda",
                "fail",
                value,
                f"the driver supports CUDA {nvml.cuda_driver_version}, torch needs {cuda_build}: "
                "upgrade the NVIDIA driver or install a torch built for an older CUDA",
                data,
            )
        return Finding("cuda", "ok", value, "", data)
    if nvml.available:
        if not cuda_build:
            return Finding(
                "cuda",
                "fail",
                f"no: CPU build of torch, but NVML sees {len(nvml.gpus)} GPU(s)",
                "install a CUDA build of torch (see pytorch.org/get-started) or training runs on the CPU",
                data,
            )
        return Finding(
            "cuda",
            "fail",
            "no: torch has CUDA but cannot use the GPUs NVML sees",
            "check CUDA_VISIBLE_DEVICES and that the driver matches torch's CUDA version",
            data,
        )
    if cuda_build:
        return Finding(
            "cuda", "ok", "no GPU visible (CUDA build of torch)", "training runs on the CPU", data
        )
    return Finding("cuda", "ok", "no (CPU build, no NVIDIA GPU)", "training runs on the CPU", data)


def _cudnn(torch: ModuleType) -> Finding:
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if version is not None:
        return Finding("cudnn", "ok", str(version), "", {"version": version})
    if torch.version.cuda:
        return Finding(
            "cudnn",
            "warn",
            "not available",
            "convolutions will be slow without cuDNN",
            {"version": None},
        )
    return Finding("cudnn", "ok", "not used (CPU build)", "", {"version": None})


def _gpus(torch: ModuleType, nvml: GpuReport) -> list[Finding]:
    if not nvml.available:
        return [
            Finding("gpu", "ok", f"none ({nvml.reason})", "", {"gpus": [], "reason": nvml.reason})
        ]
    found = []
    torch_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for gpu in nvml.gpus:
        cc = gpu.compute_capability
        if gpu.index < torch_count:
            cc = tuple(torch.cuda.get_device_capability(gpu.index))
        bf16 = cc is not None and cc >= (8, 0)
        cc_text = f"{cc[0]}.{cc[1]}" if cc else "unknown"
        found.append(
            Finding(
                f"gpu {gpu.index}",
                "ok",
                f"{gpu.name}, {gpu.memory_total_bytes / GiB:.1f} GiB, compute {cc_text}, "
                f"bf16 {'yes' if bf16 else 'no'}, driver {nvml.driver_version}",
                "" if bf16 else "no bf16: mixed precision uses fp16 with a GradScaler",
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    "memory_total_bytes": gpu.memory_total_bytes,
                    "compute_capability": cc_text,
                    "bf16": bf16,
                    "driver": nvml.driver_version,
                },
            )
        )
    return found


def _tf32(torch: ModuleType, nvml: GpuReport) -> Finding:
    precision = torch.get_float32_matmul_precision()
    data = {"float32_matmul_precision": precision}
    ampere = any((g.compute_capability or (0, 0)) >= (8, 0) for g in nvml.gpus)
    if not (nvml.available and torch.cuda.is_available()):
        return Finding(
            "tf32", "ok", f"n/a on CPU (float32 matmul precision {precision!r})", "", data
        )
    if ampere and precision == "highest":
        return Finding(
            "tf32",
            "warn",
            "off (float32 matmul precision 'highest')",
            "torch.set_float32_matmul_precision('high') runs fp32 matmuls on tensor cores (TF32)",
            data,
        )
    return Finding("tf32", "ok", f"float32 matmul precision {precision!r}", "", data)


def _pip_check() -> Finding:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "check"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("pip check", "warn", f"could not run: {exc}", "")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode == 0:
        return Finding("pip check", "ok", "no broken requirements", "", {"problems": []})
    if "No module named pip" in proc.stderr:
        return Finding("pip check", "warn", "pip is not installed in this environment", "")
    return Finding(
        "pip check",
        "warn",
        f"{len(lines)} problem(s): {lines[0] if lines else proc.stderr.strip()}",
        "fix the broken requirements before a long run (pip install the versions named)",
        {"problems": lines},
    )


def _environment() -> Finding:
    if sys.prefix != sys.base_prefix:
        return Finding(
            "environment", "ok", f"virtual environment {sys.prefix}", "", {"kind": "venv"}
        )
    if os.environ.get("CONDA_PREFIX"):
        return Finding(
            "environment",
            "ok",
            f"conda environment {os.environ['CONDA_PREFIX']}",
            "",
            {"kind": "conda"},
        )
    return Finding(
        "environment",
        "warn",
        f"system Python {sys.prefix}",
        "use a virtual environment so the training stack's versions stay pinned",
        {"kind": "system"},
    )


def suggested_num_workers(cpus: int, gpus: int) -> int:
    """DataLoader workers per training process: the CPUs per GPU less one for the main process."""
    per_process = cpus // max(1, gpus)
    return max(0, min(8, per_process - 1))


def _cpu(nvml: GpuReport) -> Finding:
    usable = usable_cpus()
    quota = cgroup_cpu_limit()
    workers = suggested_num_workers(usable, len(nvml.gpus))
    value = f"{usable} usable of {os.cpu_count()}"
    if quota is not None:
        value += f" (cgroup quota {quota:g})"
    return Finding(
        "cpu",
        "ok",
        value,
        f"DataLoader num_workers={workers}" + (" per GPU process" if nvml.gpus else ""),
        {
            "usable": usable,
            "logical": os.cpu_count(),
            "cgroup_quota": quota,
            "num_workers": workers,
        },
    )


def _memory() -> Finding:
    vm = psutil.virtual_memory()
    limit = cgroup_memory_limit()
    total = min(vm.total, limit) if limit else vm.total
    value = f"{vm.available / GiB:.1f} GiB available of {total / GiB:.1f} GiB"
    if limit:
        value += " (cgroup limit)"
    data = {"total_bytes": total, "available_bytes": vm.available, "cgroup_limit_bytes": limit}
    if vm.available < 2 * GiB:
        return Finding(
            "memory",
            "warn",
            value,
            "little free memory: DataLoader workers each copy the dataset object",
            data,
        )
    return Finding("memory", "ok", value, "", data)


def _shm(path: str = "/dev/shm") -> Finding:
    try:
        st = os.statvfs(path)
    except OSError:
        return Finding(
            "/dev/shm",
            "warn",
            "missing",
            "DataLoader workers need shared memory; use num_workers=0",
            {},
        )
    size = st.f_frsize * st.f_blocks
    data = {"size_bytes": size, "free_bytes": st.f_frsize * st.f_bavail}
    value = f"{size / GiB:.2f} GiB"
    if size < SHM_MIN_BYTES:
        return Finding(
            "/dev/shm",
            "warn",
            value,
            "too small for DataLoader workers: docker run --shm-size=8g (or --ipc=host)",
            data,
        )
    return Finding("/dev/shm", "ok", value, "", data)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def read_gpus() -> GpuReport:
    source = NvmlSource()
    try:
        return source.sample()
    finally:
        source.close()


def system_findings(nvml_reader: Callable[[], GpuReport] = read_gpus) -> list[Finding]:
    """Every machine-wide check, in the order a practitioner reads them."""
    nvml = nvml_reader()
    findings = [_python()]
    try:
        import torch
    except ImportError as exc:
        findings.append(
            Finding(
                "torch", "fail", f"not importable: {exc}", "pip install torch", {"version": None}
            )
        )
    else:
        findings += [_torch_build(torch), _cuda(torch, nvml), _cudnn(torch)]
        findings += _gpus(torch, nvml)
        findings.append(_tf32(torch, nvml))
    findings += [_pip_check(), _environment(), _cpu(nvml), _memory(), _shm()]
    return findings
