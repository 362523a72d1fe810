"""
NVIDIA GPUs through NVML (the `pynvml` module of the `nvidia-ml-py` distribution).

No driver, no library or no GPU is an answer (`NvmlReport.available` false, with the reason),
never an exception and never a row of zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML sees it."""

    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    compute_capability: tuple[int, int] | None


@dataclass(frozen=True)
class NvmlReport:
    """What NVML says about this machine."""

    available: bool
    reason: str = ""
    driver_version: str = ""
    cuda_driver_version: str = ""
    gpus: tuple[NvmlGpu, ...] = ()


def _text(value: Any) -> str:
    # Old nvidia-ml-py releases return bytes, new ones str.
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml() -> NvmlReport:
    """Query NVML once: driver and every GPU. Initialises and shuts NVML down around the query."""
    try:
        import pynvml
    except ImportError as exc:
        return NvmlReport(False, f"nvidia-ml-py is not installed ({exc})")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlReport(False, f"NVML could not start: {exc} (no NVIDIA driver on this machine?)")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                cc: tuple[int, int] | None = (int(major), int(minor))
            except pynvml.NVMLError:
                cc = None
            gpus.append(
                NvmlGpu(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    compute_capability=cc,
                )
            )
    except pynvml.NVMLError as exc:
        return NvmlReport(False, f"NVML query failed: {exc}")
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        return NvmlReport(False, "NVML runs but reports no GPU", driver)
    return NvmlReport(
        True,
        driver_version=driver,
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        gpus=tuple(gpus),
    )
