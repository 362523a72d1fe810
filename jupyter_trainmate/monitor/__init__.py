"""
Internal (for contributors): metric sources behind one interface: NVML for NVIDIA GPUs (`nvml.NvmlSource`), psutil and the
cgroup for the host (`host.HostSource`), and a fake GPU source for tests on machines without a GPU
(`fake.FakeGpuSource`, which says so in every answer). NVML absent is a normal state: the answer
is `available: false` with the reason, never an exception and never zeros.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class MigSample:
    """One MIG instance of a GPU."""

    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. None: the driver does not report that quantity for this GPU."""

    index: int
    name: str
    uuid: str
    utilization_pct: float | None
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    mig: tuple[MigSample, ...] = ()
    compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class GpuReport:
    """Every GPU at one moment, or why there is no answer."""

    available: bool
    source: str  # "nvml" or "fake"
    reason: str = ""
    driver_version: str = ""
    cuda_driver_version: str = ""  # the newest CUDA the driver supports, "12.9"
    gpus: tuple[GpuSample, ...] = field(default=())


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on one GPU (NVML's compute process list)."""

    gpu: int  # the GpuSample index
    pid: int
    used_bytes: int | None  # None: the driver does not say (e.g. under MIG without privileges)


class GpuSource(Protocol):
    """Anything that can sample the GPUs; `sample()` and `processes()` may block (call them off
    an event loop)."""

    def sample(self) -> GpuReport: ...

    def processes(self) -> tuple[GpuProcess, ...]:
        """The compute processes of every GPU; empty when there is no GPU data."""
        ...

    def close(self) -> None: ...
