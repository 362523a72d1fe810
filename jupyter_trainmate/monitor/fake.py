"""
A GPU source with fixed, known numbers, for tests and demos on machines without a GPU.

It stands in only for the hardware: every answer says `source: "fake"`, so it can never pass for
a real reading. The server uses it only when `TRAINMATE_FAKE_GPUS` is set (a JSON list of GPUs).
Its compute processes are the ones given to it, or, when `TRAINMATE_FAKE_GPU_PROCESSES` names a
JSON file (`[{"gpu": 0, "pid": 1234, "used_bytes": 1073741824}, ...]`), that file's live ones, read at
each call (tests write the pids of the kernels they start there).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import psutil

from . import GpuProcess, GpuReport, GpuSample

ENV_VAR = "TRAINMATE_FAKE_GPUS"
PROCESSES_ENV_VAR = "TRAINMATE_FAKE_GPU_PROCESSES"


class FakeGpuSource:
    """Returns the GPUs it was given; `set_utilization()` changes one between samples."""

    def __init__(
        self,
        gpus: list[GpuSample],
        driver_version: str = "fake-0.0",
        processes: tuple[GpuProcess, ...] = (),
        processes_file: Path | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.calls = 0
        self.given_processes = processes
        self.processes_file = processes_file

    @classmethod
    def from_json(cls, text: str) -> FakeGpuSource:
        """`[{"name": ..., "memory_total_bytes": ..., ...}, ...]`: unspecified fields get defaults."""
        gpus = []
        for index, spec in enumerate(json.loads(text)):
            gpus.append(
                GpuSample(
                    index=index,
                    name=str(spec.get("name", f"Fake GPU {index}")),
                    uuid=str(spec.get("uuid", f"GPU-fake-{index}")),
                    utilization_pct=spec.get("utilization_pct", 50.0),
                    memory_used_bytes=int(spec.get("memory_used_bytes", 8 * 1024**3)),
                    memory_total_bytes=int(spec.get("memory_total_bytes", 80 * 1024**3)),
                    temperature_c=spec.get("temperature_c", 60.0),
                    power_w=spec.get("power_w", 300.0),
                    power_limit_w=spec.get("power_limit_w", 700.0),
                )
            )
        processes_file = os.environ.get(PROCESSES_ENV_VAR)
        return cls(gpus, processes_file=Path(processes_file) if processes_file else None)

    def sample(self) -> GpuReport:
        self.calls += 1
        return GpuReport(True, "fake", driver_version=self.driver_version, gpus=tuple(self.gpus))

    def processes(self) -> tuple[GpuProcess, ...]:
        if self.processes_file is None:
            return self.given_processes
        try:
            specs = json.loads(self.processes_file.read_text())
        except (OSError, ValueError):
            return ()  # not written yet, or being written
        found = (
            GpuProcess(int(s.get("gpu", 0)), int(s["pid"]), s.get("used_bytes")) for s in specs
        )
        # As NVML would: a process that ended holds no memory any more.
        return tuple(p for p in found if psutil.pid_exists(p.pid))

    def set_utilization(self, index: int, pct: float) -> None:
        self.gpus[index] = replace(self.gpus[index], utilization_pct=pct)

    def close(self) -> None:
        pass
