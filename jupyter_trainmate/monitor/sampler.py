"""Device readings for the live display: the GPU source, the host and this process's memory.

The display's one thread per run calls `sample_once()` about once a second; readers use
`latest` and never wait on NVML.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import GpuReport, GpuSource
from .host import HostSample, HostSource, shared_host, this_process


@dataclass(frozen=True)
class DeviceSample:
    """One reading: the GPUs (or why none), the host, and this process's memory."""

    gpu: GpuReport
    host: HostSample
    process_rss_bytes: int


class Sampler:
    """Takes readings on demand and keeps the latest."""

    def __init__(self, gpu: GpuSource, host: HostSource | None = None) -> None:
        self._gpu = gpu
        self._host = host or shared_host()
        self._process = this_process()
        self.latest: DeviceSample | None = None
        self.samples = 0

    def sample_once(self) -> DeviceSample:
        sample = DeviceSample(
            self._gpu.sample(), self._host.sample(), self._process.memory_info().rss
        )
        self.latest = sample
        self.samples += 1
        return sample
