"""The cyclic garbage collector's pauses, per side of a paired benchmark.

A full collection of the benchmarks' process (IPython, torch, Optuna: about 350,000 tracked
objects) takes a few hundred milliseconds here, and it lands on whichever side's allocation
happens to cross the collector's threshold: one such pause in a 1.4 s sweep would move that
pair's ratio by 20-30 points. `Collections` sums the pauses and counts the collections of each
generation per side, so that a figure can be read with them.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any


class Collections:
    """gc pauses (seconds) and collections per generation, summed per named side."""

    def __init__(self) -> None:
        self.pause_s: dict[str, float] = defaultdict(float)
        self.counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        self._side: str | None = None
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if self._side is None:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pause_s[self._side] += time.perf_counter() - self._began
            self.counts[self._side][info["generation"]] += 1

    @contextlib.contextmanager
    def side(self, name: str | None) -> Iterator[None]:
        """Count what is collected while the block runs as `name`'s (None: not counted)."""
        self._side = name
        try:
            yield
        finally:
            self._side = None

    def line(self) -> str:
        return "; ".join(
            f"{name}: gc {self.pause_s[name] * 1000:.0f} ms in all, collections by generation "
            f"{'/'.join(map(str, self.counts[name]))}"
            for name in sorted(self.counts)
        )
