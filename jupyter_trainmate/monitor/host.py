"""
Host CPU and memory, honouring the container's cgroup limits (v2 and v1).

In a container `os.cpu_count()` and `psutil.virtual_memory()` report the whole machine; what the
process may really use is in the cgroup. Both answers are given so advice can name the right one.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as a huge page-aligned number instead of "max".
_V1_UNLIMITED = 1 << 60


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup allows (quota / period), or None when unlimited or unknown."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota_v1 = _read(root / "cpu" / "cpu.cfs_quota_us")
    period_v1 = _read(root / "cpu" / "cpu.cfs_period_us")
    if quota_v1 and period_v1 and int(quota_v1) > 0:
        return int(quota_v1) / int(period_v1)
    return None


def cgroup_memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """Bytes of memory the cgroup allows, or None when unlimited or unknown."""
    v2 = _read(root / "memory.max")
    if v2 is not None:
        return None if v2 == "max" else int(v2)
    v1 = _read(root / "memory" / "memory.limit_in_bytes")
    if v1 and int(v1) < _V1_UNLIMITED:
        return int(v1)
    return None


def usable_cpus(root: Path = CGROUP_ROOT) -> int:
    """CPUs this process can run on: affinity mask, capped by the cgroup quota (at least 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    quota = cgroup_cpu_limit(root)
    if quota is not None:
        count = min(count, max(1, int(quota)))
    return max(1, count)
