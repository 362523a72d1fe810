"""Bounded series for charts: a week-long run keeps a fixed number of points.

When a series is full, its older half is thinned by averaging neighbouring pairs: recent steps keep
full detail, the distant past keeps its shape, memory stays constant.
"""

from __future__ import annotations


class BoundedSeries:
    """(x, y) points, at most `max_points` of them."""

    def __init__(self, max_points: int = 512) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self.max_points = max_points
        self.xs: list[float] = []
        self.ys: list[float] = []

    def __len__(self) -> int:
        return len(self.xs)

    def append(self, x: float, y: float) -> None:
        self.xs.append(x)
        self.ys.append(y)
        if len(self.xs) > self.max_points:
            self._thin_older_half()

    def _thin_older_half(self) -> None:
        half = len(self.xs) // 2
        half -= half % 2
        xs = [(self.xs[i] + self.xs[i + 1]) / 2 for i in range(0, half, 2)]
        ys = [(self.ys[i] + self.ys[i + 1]) / 2 for i in range(0, half, 2)]
        self.xs = xs + self.xs[half:]
        self.ys = ys + self.ys[half:]

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self.xs, self.ys, strict=True))


class Throttle:
    """Lets an update through at most once per `interval` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = float("-inf")

    def ready(self, now: float) -> bool:
        if now - self._last >= self.interval:
            self._last = now
            return True
        return False
