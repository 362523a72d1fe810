"""Which notebook holds which GPU memory: NVML's compute processes mapped to this server's kernels.

A GPU process belongs to a kernel when it is the kernel's process or one of its descendants (a
DataLoader worker, a subprocess the notebook started). Kernels come from the server's kernel
manager (their process ids from the local provisioner), notebooks from its session manager.
Processes that are no kernel of this server are listed by pid and command line.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import psutil

from ..monitor import GpuProcess, GpuSource


@dataclass(frozen=True)
class KernelInfo:
    """What the sidebar shows of one kernel of this server."""

    kernel_id: str
    kernel_name: str
    pid: int | None
    execution_state: str
    last_activity: float | None  # seconds since the epoch
    path: str | None  # the notebook (session path), None for a kernel without a session


def kernel_pid(kernel_manager: Any, kernel_id: str) -> int | None:
    """The process id of a local kernel (None for remote provisioners or a kernel starting)."""
    try:
        provisioner = kernel_manager.get_kernel(kernel_id).provisioner
    except KeyError:
        return None
    process = getattr(provisioner, "process", None)
    pid = getattr(process, "pid", None) or getattr(provisioner, "pid", None)
    return int(pid) if isinstance(pid, int) else None


async def server_kernels(kernel_manager: Any, session_manager: Any) -> list[KernelInfo]:
    """Every kernel of this server, with its notebook when a session names one."""
    paths: dict[str, str] = {}
    for session in await session_manager.list_sessions():
        kernel = session.get("kernel") or {}
        if kernel.get("id") and session.get("path"):
            paths[kernel["id"]] = session["path"]
    found = []
    for kernel_id in kernel_manager.list_kernel_ids():
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
        except KeyError:
            continue  # shut down meanwhile
        activity = getattr(kernel, "last_activity", None)
        found.append(
            KernelInfo(
                kernel_id=kernel_id,
                kernel_name=str(getattr(kernel, "kernel_name", "")),
                pid=kernel_pid(kernel_manager, kernel_id),
                execution_state=str(getattr(kernel, "execution_state", "unknown")),
                last_activity=activity.timestamp() if activity is not None else None,
                path=paths.get(kernel_id),
            )
        )
    return found


def _owner(pid: int, kernel_by_pid: dict[int, KernelInfo]) -> KernelInfo | None:
    if pid in kernel_by_pid:
        return kernel_by_pid[pid]
    try:
        parents = psutil.Process(pid).parents()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None
    for parent in parents:
        if parent.pid in kernel_by_pid:
            return kernel_by_pid[parent.pid]
    return None


def _command(pid: int) -> str:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        process = psutil.Process(pid)
        return " ".join(process.cmdline()) or process.name()
    return "(not visible from this server)"


def _add(gpus: dict[int, int | None], gpu: int, used: int | None) -> None:
    before = gpus.get(gpu, 0)
    gpus[gpu] = None if used is None or before is None else before + used


def _bytes(value: object) -> int:
    return value if isinstance(value, int) else 0


def _most_memory_first(notebook: dict[str, Any]) -> tuple[int, str, str]:
    return (-_bytes(notebook["used_bytes"]), notebook["path"] or "", notebook["kernel_id"])


def gpu_memory_by_notebook(
    processes: tuple[GpuProcess, ...], kernels: list[KernelInfo]
) -> dict[str, Any]:
    """`notebooks`: the kernels holding GPU memory (most first) with their memory per GPU and
    in all; `others`: the GPU processes of no kernel of this server. Blocks (psutil)."""
    kernel_by_pid = {k.pid: k for k in kernels if k.pid is not None}
    held: dict[str, tuple[KernelInfo, dict[int, int | None], list[int]]] = {}
    others = []
    for proc in processes:
        kernel = _owner(proc.pid, kernel_by_pid)
        if kernel is None:
            others.append(
                {
                    "gpu": proc.gpu,
                    "pid": proc.pid,
                    "used_bytes": proc.used_bytes,
                    "command": _command(proc.pid),
                }
            )
            continue
        _, gpus, pids = held.setdefault(kernel.kernel_id, (kernel, {}, []))
        _add(gpus, proc.gpu, proc.used_bytes)
        if proc.pid not in pids:
            pids.append(proc.pid)
    notebooks = []
    for kernel, gpus, pids in held.values():
        known = [v for v in gpus.values() if v is not None]
        notebooks.append(
            {
                "kernel_id": kernel.kernel_id,
                "kernel_name": kernel.kernel_name,
                "path": kernel.path,
                "execution_state": kernel.execution_state,
                "last_activity": kernel.last_activity,
                "used_bytes": sum(known) if len(known) == len(gpus) else None,
                "gpus": [{"gpu": g, "used_bytes": b} for g, b in sorted(gpus.items())],
                "pids": sorted(pids),
            }
        )
    notebooks.sort(key=_most_memory_first)
    others.sort(key=lambda o: (o["gpu"], -_bytes(o["used_bytes"]), o["pid"]))
    return {"notebooks": notebooks, "others": others}


def sample_gpu_memory(source: GpuSource, kernels: list[KernelInfo]) -> dict[str, Any]:
    """The source's processes mapped to `kernels` (blocks: NVML and psutil)."""
    return gpu_memory_by_notebook(source.processes(), kernels)
