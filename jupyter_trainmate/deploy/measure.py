"""How `bench()` measures: the timer, peak memory, precision support, the machine it states.

`measure_calls` runs `torch.utils.benchmark.Timer.blocked_autorange` (blocks of calls until
`min_run_time` is spent; the Timer synchronises CUDA) and tops it up to `MIN_BLOCKS` blocks so
that the percentiles have something to stand on. Peak memory is the CUDA allocator's peak on a
GPU and the process's RSS high-water mark on a CPU.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_BLOCKS = 10


def precision_unsupported(precision: str, device: Any) -> str:
    import torch

    if precision == "fp32":
        return ""
    if device.type == "cuda":
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16"
        return ""
    if precision == "fp16":
        return "fp16 on a CPU: no fast kernels, measured on GPUs only"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no bf16 instructions (AVX512-BF16 or AMX)"
    return ""


@dataclass(frozen=True)
class Timing:
    p50_ms: float
    p95_ms: float
    p99_ms: float
    samples_per_s: float
    timed_calls: int
    blocks: int


def measure_calls(
    call: Callable[[], None], batch: int, min_run_time: float, threads: int
) -> Timing:
    """p50, p95, p99 (ms per call, over the blocks) and samples/s from `blocked_autorange`."""
    import numpy as np
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="call()", globals={"call": call}, num_threads=threads)
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    per_block = measurement.number_per_run
    blocks = list(measurement.times)
    while len(blocks) < MIN_BLOCKS:  # percentiles need some blocks, however short the budget
        blocks += timer.timeit(per_block).times
    times = np.asarray(blocks) * 1e3
    p50, p95, p99 = (float(np.percentile(times, q)) for q in (50, 95, 99))
    return Timing(p50, p95, p99, batch / (p50 / 1e3), len(times) * per_block, len(times))


class Memory:
    """Peak memory of a row: the CUDA allocator's peak on a GPU, the process's peak RSS on a CPU.

    On Linux the RSS high-water mark (VmHWM) is reset before each row by writing 5 to
    /proc/self/clear_refs; where that is not possible the RSS after the row is reported instead.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        if device.type == "cuda":
            self.what = "CUDA allocator peak"
        elif _reset_hwm():
            self.what = "process peak RSS (VmHWM, reset per row)"
        else:
            self.what = "process RSS after the row (no peak counter here)"

    def reset(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_hwm()

    def peak_mb(self) -> float:
        import psutil
        import torch

        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        status = Path("/proc/self/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float(psutil.Process().memory_info().rss) / 2**20


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def describe(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} logical cores)"


def versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for package in ("torch", "onnxruntime"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[package] = importlib.metadata.version(package)
    return found
