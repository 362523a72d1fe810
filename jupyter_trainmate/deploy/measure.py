"""How `bench()` measures: the timer, peak memory, precision support, the machine it states.

`measure_rounds` times every row of a bench in rounds: each round gives each row a share of its
`min_run_time` (`torch.utils.benchmark.Timer.blocked_autorange` in the first round, which also
fixes the calls per block, `timeit` blocks of that size after), the rows' order rotating from
round to round. Another process's burst of work on a shared machine then lands on a slice of
every row instead of on one whole row. p50/p95/p99 are percentiles of all the blocks (at least
`MIN_BLOCKS`), each round weighing the same. The clock is the wall clock (what a caller waits),
or with `clock="cpu"` the calling thread's CPU time (`time.thread_time`, one intra-op thread so that all
the work is on that thread): it leaves out the time the OS gave the core to other processes,
which is most of the noise on a busy machine, and keeps what cache and memory contention cost.
The Timer synchronises CUDA. Peak memory is the CUDA allocator's peak on a GPU and the process's
RSS high-water mark on a CPU, over the row's first round.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


CLOCKS = ("wall", "cpu")


class Timed(Protocol):
    """A row ready to be timed: warm, `call` to be run inside `context()`."""

    batch: int

    def call(self) -> None: ...

    def context(self) -> contextlib.AbstractContextManager[None]: ...


def measure_rounds(
    rows: Sequence[Timed],
    min_run_time: float,
    rounds: int,
    threads: int,
    clock: str,
    memory: Memory | None,
) -> list[tuple[Timing, float | None]]:
    """Each row's timing and peak memory (MB, over its first round), timed in `rounds` rounds."""
    from torch.utils import benchmark

    clock_fn = time.thread_time if clock == "cpu" else time.perf_counter
    timers = [
        benchmark.Timer(
            stmt="call()", globals={"call": row.call}, num_threads=threads, timer=clock_fn
        )
        for row in rows
    ]
    numbers = [0] * len(rows)
    blocks: list[list[list[float]]] = [[] for _ in rows]  # per row, per round: its blocks
    peaks: list[float | None] = [None] * len(rows)
    share = min_run_time / rounds
    for turn in range(rounds):
        for i in _rotated(len(rows), turn):
            timer = timers[i]
            with rows[i].context():
                if turn == 0:
                    if memory is not None:
                        memory.reset()
                    measurement = timer.blocked_autorange(min_run_time=share)
                    numbers[i] = measurement.number_per_run
                    times = list(measurement.times)
                    if memory is not None:
                        peaks[i] = memory.peak_mb()
                else:
                    times = _blocks(timer, numbers[i], share)
            blocks[i].append(list(times))
    results = []
    for i, row in enumerate(rows):
        while sum(map(len, blocks[i])) < MIN_BLOCKS:  # percentiles need some blocks
            with rows[i].context():
                blocks[i][-1] += timers[i].timeit(numbers[i]).times
        p50, p95, p99 = (ms * 1e3 for ms in _round_percentiles(blocks[i], (50, 95, 99)))
        count = sum(map(len, blocks[i]))
        timing = Timing(p50, p95, p99, row.batch / (p50 / 1e3), count * numbers[i], count)
        results.append((timing, peaks[i]))
    return results


def _round_percentiles(rounds: list[list[float]], qs: Sequence[float]) -> list[float]:
    """Percentiles of all the blocks, each round weighing the same (a block: 1 / its round's
    blocks). The first round's autorange can give a row many more blocks than a later round's
    share does, and a round that a burst of other work hit should not count for more or less
    than one round; one weighting for every percentile keeps p50 <= p95 <= p99 (a median of
    round medians beside percentiles of the pooled blocks did not: CI saw p50 above p95)."""
    import numpy as np

    values = np.concatenate([np.asarray(times, dtype=float) for times in rounds if times])
    weights = np.concatenate([np.full(len(times), 1.0 / len(times)) for times in rounds if times])
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    cumulative /= cumulative[-1]
    # the smallest value whose cumulative weight reaches q (no interpolation across rounds)
    return [
        float(values[min(int(np.searchsorted(cumulative, q / 100 - 1e-12)), len(values) - 1)])
        for q in qs
    ]


def _rotated(n: int, turn: int) -> list[int]:
    """The rows' order in round `turn`: rotated by one each round."""
    return [(turn + k) % n for k in range(n)]


def _blocks(timer: Any, number: int, seconds: float) -> list[float]:
    """Blocks of `number` calls until `seconds` of the timer's clock are spent (at least one)."""
    times: list[float] = []
    spent = 0.0
    while not times or spent < seconds:
        per_call = timer.timeit(number).times[0]
        times.append(per_call)
        spent += per_call * number
    return times


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


def busy_note(clock: str, load: float | None = None, cores: int | None = None) -> str:
    """A warning for the table when the wall clock ran on a machine busier than its cores."""
    if clock != "wall":
        return ""
    if load is None:
        with contextlib.suppress(OSError, AttributeError):
            load = os.getloadavg()[0]
    cores = cores or os.cpu_count() or 1
    if load is None or load <= cores:
        return ""
    return (
        f"the machine was busy (load average {load:.1f} on {cores} cores): wall-clock times "
        "vary from run to run here; clock cpu (--clock cpu) times the work of a call instead"
    )
