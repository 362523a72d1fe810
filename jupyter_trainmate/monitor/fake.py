"""
A GPU source with fixed, known numbers, for tests and demos on machines without a GPU.

It stands in only for the hardware: every answer says `source: "fake"`, so it can never pass for
a real reading. The server uses it only when `TRAINMATE_FAKE_GPUS` is set (a JSON list of GPUs).
"""

from __future__ import annotations

import json
from dataclasses import replace

from . import GpuReport, GpuSample

ENV_VAR = "TRAINMATE_FAKE_GPUS"


class FakeGpuSource:
    """Returns the GPUs it was given; `set_utilization()` changes one between samples."""

    def __init__(self, gpus: list[GpuSample], driver_version: str = "fake-0.0") -> None:
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.calls = 0

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
        return cls(gpus)

    def sample(self) -> GpuReport:
        self.calls += 1
        return GpuReport(True, "fake", driver_version=self.driver_version, gpus=tuple(self.gpus))

    def set_utilization(self, index: int, pct: float) -> None:
        self.gpus[index] = replace(self.gpus[index], utilization_pct=pct)

    def close(self) -> None:
        pass
