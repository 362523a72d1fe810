"""
`trainmate doctor --data PATH`: where the training data lives and how fast it reads.

File system type and whether it is a network mount come from the mount table (psutil); the disk
kind (NVMe, SSD, rotational) from sysfs; the read speed from reading the files for a short,
bounded time after asking the kernel to drop them from the page cache (so it is a disk read, not a
memory copy, where the kernel honours the request).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from ..errors import TrainmateError
from .checks import Finding

NETWORK_FS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "lustre", "gpfs", "beegfs", "ceph",
    "glusterfs", "afs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone",
    "fuse.juicefs", "fuse.mountpoint-s3", "fuse.blobfuse2", "virtiofs",
}  # fmt: skip
READ_BUDGET_S = 2.0
READ_LIMIT_BYTES = 256 * 1024**2
CHUNK = 4 * 1024**2
SLOW_READ_MB_S = 100.0
# Below this much data the figure is mostly open() latency, too little to call the disk slow.
JUDGE_MIN_BYTES = 16 * 1024**2


class DataPathError(TrainmateError):
    """The `--data` path cannot be checked (the message is one line for the user)."""


def _mount_of(path: Path) -> tuple[str, str] | None:
    """(mount point, file system type) of the longest mount point above `path`."""
    best: tuple[str, str] | None = None
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        if (path == Path(mount) or Path(mount) in path.parents) and (
            best is None or len(mount) > len(best[0])
        ):
            best = (mount, part.fstype)
    return best


def _mount(path: Path) -> Finding:
    found = _mount_of(path)
    if found is None:
        return Finding("data fs", "warn", "mount not found", "", {"fstype": None})
    mountpoint, fstype = found
    network = fstype in NETWORK_FS
    data = {"fstype": fstype, "mountpoint": mountpoint, "network": network}
    value = f"{fstype} at {mountpoint} ({'network' if network else 'local'})"
    if network:
        return Finding(
            "data fs",
            "warn",
            value,
            "network storage: copy the data to a local SSD, or raise num_workers to hide latency",
            data,
        )
    return Finding("data fs", "ok", value, "", data)


def _disk(path: Path) -> Finding:
    dev = path.stat().st_dev
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sys_dev.exists():
        return Finding(
            "data disk", "ok", "no block device (tmpfs, overlay or network)", "", {"kind": None}
        )
    disk = sys_dev.resolve()
    if (disk / "partition").exists():
        disk = disk.parent
    try:
        rotational = (disk / "queue" / "rotational").read_text().strip() == "1"
    except OSError:
        rotational = None
    if disk.name.startswith("nvme"):
        kind = "NVMe SSD"
    elif rotational is False:
        kind = "SSD"
    elif rotational:
        kind = "rotational"
    else:
        kind = "unknown"
    data = {"device": disk.name, "kind": kind, "rotational": rotational}
    if kind == "rotational":
        # Virtual disks (virtio, Xen) often claim to rotate: the measured read speed decides.
        return Finding(
            "data disk",
            "ok",
            f"{disk.name}: reports rotational (virtual disks often do)",
            "on a real spinning disk prefer sequential shards (WebDataset) or an SSD",
            data,
        )
    return Finding("data disk", "ok", f"{disk.name}: {kind}", "", data)


def _files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "node_modules")
        for name in sorted(files):
            candidate = Path(root, name)
            if candidate.is_file() and not candidate.is_symlink():
                yield candidate


def _read_speed(path: Path) -> Finding:
    total = 0
    files = 0
    cold = True
    started = time.perf_counter()
    buf = bytearray(CHUNK)
    for file in _files(path):
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue
        files += 1
        try:
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except (OSError, AttributeError):
                cold = False
            while n := os.readv(fd, [buf]):
                total += n
                if total >= READ_LIMIT_BYTES or time.perf_counter() - started > READ_BUDGET_S:
                    break
        finally:
            os.close(fd)
        if total >= READ_LIMIT_BYTES or time.perf_counter() - started > READ_BUDGET_S:
            break
    elapsed = time.perf_counter() - started
    if total == 0:
        return Finding("data read", "ok", "no readable files to measure", "", {"bytes": 0})
    mb_s = total / 1e6 / max(elapsed, 1e-9)
    data = {
        "bytes": total,
        "files": files,
        "seconds": elapsed,
        "mb_per_s": mb_s,
        "files_per_s": files / max(elapsed, 1e-9),
        "cold_cache": cold,
    }
    value = f"{mb_s:,.0f} MB/s, {data['files_per_s']:,.0f} files/s over {total / 1e6:,.1f} MB" + (
        "" if cold else " (may be cached)"
    )
    if total < JUDGE_MIN_BYTES:
        return Finding("data read", "ok", value, "too little data read to judge the disk", data)
    if mb_s < SLOW_READ_MB_S:
        return Finding(
            "data read",
            "warn",
            value,
            "slow reads: use more DataLoader workers, cache the data locally, or pack it into shards",
            data,
        )
    return Finding("data read", "ok", value, "", data)


def storage_findings(path: Path) -> list[Finding]:
    """File system, disk kind and read speed of the training data at `path`."""
    try:
        resolved = path.resolve(strict=True)
    except OSError as exc:
        raise DataPathError(f"--data {path}: {exc.strerror or exc}") from None
    except RuntimeError as exc:  # a symlink loop
        raise DataPathError(f"--data {path}: {exc}") from None
    return [_mount(resolved), _disk(resolved), _read_speed(resolved)]
