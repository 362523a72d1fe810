"""Bounded series for charts: a week-long run keeps a fixed number of points.

The newest half of the points is kept exactly (recent detail). Older points leave it into an
archive at a stride: each archived point averages `stride` consecutive points, and whenever the
archive is full its neighbouring pairs are merged and the stride doubles. The archive thus covers
the whole run evenly, however long, and memory stays constant.
"""

from __future__ import annotations

from collections import deque


def _mean(points: list[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    return (sum(p[0] for p in points) / n, sum(p[1] for p in points) / n)


class BoundedSeries:
    """(x, y) points, at most `max_points` of them (+1 for a partly filled archive bucket)."""

    def __init__(self, max_points: int = 512) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self.max_points = max_points
        self._recent: deque[tuple[float, float]] = deque()
        self._recent_max = max_points // 2
        self._archive: list[tuple[float, float]] = []
        self._archive_max = max_points - self._recent_max
        self._bucket: list[tuple[float, float]] = []
        self.stride = 1

    def __len__(self) -> int:
        return len(self._archive) + (1 if self._bucket else 0) + len(self._recent)

    def append(self, x: float, y: float) -> None:
        self._recent.append((x, y))
        if len(self._recent) <= self._recent_max:
            return
        self._bucket.append(self._recent.popleft())
        if len(self._bucket) < self.stride:
            return
        self._archive.append(_mean(self._bucket))
        self._bucket = []
        if len(self._archive) > self._archive_max:
            pairs = self._archive
            merged = [_mean(pairs[i : i + 2]) for i in range(0, len(pairs) - 1, 2)]
            self._archive = merged + ([pairs[-1]] if len(pairs) % 2 else [])
            self.stride *= 2

    def points(self) -> list[tuple[float, float]]:
        bucket = [_mean(self._bucket)] if self._bucket else []
        return [*self._archive, *bucket, *self._recent]

    @property
    def xs(self) -> list[float]:
        return [p[0] for p in self.points()]

    @property
    def ys(self) -> list[float]:
        return [p[1] for p in self.points()]
