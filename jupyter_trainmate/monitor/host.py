"""
Host CPU and memory, honouring the container's cgroup limits (v2 and v1).

In a container `os.cpu_count()` and `psutil.virtual_memory()` report the whole machine; what the
process may really use is in the cgroup. Both answers are given so advice can name the right one.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

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
    return _cpus_within(cgroup_cpu_limit(root))


def _cpus_within(quota: float | None) -> int:
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    if quota is not None:
        count = min(count, max(1, int(quota)))
    return max(1, count)


@dataclass(frozen=True)
class HostSample:
    """The host as this process's container sees it."""

    cpu_percent: float  # of the CPUs this container may use (cgroup quota), 0-100
    cpus: int
    memory_used_bytes: int
    memory_total_bytes: int
    limited_by_cgroup: bool


def _cgroup_cpu_usage_s(root: Path) -> float | None:
    """CPU seconds the cgroup has used (v2 cpu.stat usage_usec, v1 cpuacct.usage)."""
    stat = _read(root / "cpu.stat")
    if stat is not None:
        for line in stat.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    v1 = _read(root / "cpuacct" / "cpuacct.usage")
    return int(v1) / 1e9 if v1 else None


def _cgroup_memory_used(root: Path) -> int | None:
    v2 = _read(root / "memory.current")
    if v2 is not None:
        return int(v2)
    v1 = _read(root / "memory" / "memory.usage_in_bytes")
    return int(v1) if v1 else None


class HostSource:
    """CPU and memory use; inside a CPU or memory limit, relative to the limit, not the machine."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self._root = root
        self._quota = cgroup_cpu_limit(root)
        self._memory_limit = cgroup_memory_limit(root)
        self._last: tuple[float, float] | None = None
        psutil.cpu_percent(interval=None)  # the first call only starts psutil's interval

    def _cpu_percent(self) -> float:
        if self._quota is not None:
            used = _cgroup_cpu_usage_s(self._root)
            if used is not None:
                now = time.monotonic()
                last, self._last = self._last, (now, used)
                if last is None or now <= last[0]:
                    return 0.0
                return min(100.0, 100.0 * (used - last[1]) / ((now - last[0]) * self._quota))
        return float(psutil.cpu_percent(interval=None))

    def cpus(self) -> int:
        """CPUs this process can run on, with the quota read when the source was made."""
        return _cpus_within(self._quota)

    def sample(self) -> HostSample:
        vm = psutil.virtual_memory()
        used, total = int(vm.total - vm.available), int(vm.total)
        limited = False
        if self._memory_limit is not None and self._memory_limit < vm.total:
            cg_used = _cgroup_memory_used(self._root)
            if cg_used is not None:
                used, total, limited = cg_used, self._memory_limit, True
        return HostSample(
            cpu_percent=self._cpu_percent(),
            cpus=self.cpus(),  # the quota read once, as for the CPU share
            memory_used_bytes=used,
            memory_total_bytes=total,
            limited_by_cgroup=limited or self._quota is not None,
        )


@functools.cache
def _process(pid: int) -> psutil.Process:
    return psutil.Process(pid)


def this_process() -> psutil.Process:
    """psutil's handle on this process, made once per process (making one reads /proc: about
    0.06 ms, twice per `%%train` run before)."""
    return _process(os.getpid())


@functools.cache
def shared_host() -> HostSource:
    """One HostSource for the process: the cgroup limits are read once, not once per run (about
    0.2 ms a run), and the CPU use is a difference since the last run's last reading."""
    return HostSource()
