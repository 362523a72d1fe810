"""A background thread that reads the GPU source and the host about once a second."""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import psutil

from . import GpuReport, GpuSource
from .host import HostSample, HostSource


@dataclass(frozen=True)
class DeviceSample:
    """One reading: the GPUs (or why none), the host, and this process's memory."""

    gpu: GpuReport
    host: HostSample
    process_rss_bytes: int


class Sampler:
    """Keeps the latest `DeviceSample`; `stop()` ends the thread. Readers never wait on NVML."""

    def __init__(
        self, gpu: GpuSource, host: HostSource | None = None, interval: float = 1.0
    ) -> None:
        self._gpu = gpu
        self._host = host or HostSource()
        self._interval = interval
        self._process = psutil.Process(os.getpid())
        self.latest: DeviceSample | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainmate-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample_once(self) -> DeviceSample:
        sample = DeviceSample(
            self._gpu.sample(), self._host.sample(), self._process.memory_info().rss
        )
        self.latest = sample
        self.samples += 1
        return sample

    def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a failing reading never stops training
                self.sample_once()
            if self._stop.wait(self._interval):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
