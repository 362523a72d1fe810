"""
Checkpoints of a `%%train` run: every model, optimizer, scheduler and GradScaler the notebook
holds, the random number generators, and where the run was (epoch, batches done in it).

Writes are atomic: a temporary file in the same folder, flushed and fsynced, then `os.replace`,
so a process killed mid-write leaves the previous checkpoint whole. Loads use
`torch.load(weights_only=True)`: a checkpoint is data, never a way to run code; anything else
(a foreign pickle, a truncated file) is a one-line `TrainmateError`.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import TrainmateError
from .files import write_atomically

FORMAT = "jupyter_trainmate.checkpoint"
VERSION = 1


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (if initialised) CUDA generator states, weights_only-safe."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_objects(namespace: Mapping[str, object]) -> dict[str, dict[str, Any]]:
    """The notebook's models, optimizers and schedulers, by the names the notebook gives them."""
    found: dict[str, dict[str, Any]] = {"models": {}, "optimizers": {}, "schedulers": {}}
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        if isinstance(value, torch.nn.parallel.DistributedDataParallel):
            found["models"][name] = value.module  # checkpoints hold the model itself
        elif isinstance(value, torch.nn.Module):
            found["models"][name] = value
        elif isinstance(value, torch.optim.Optimizer):
            found["optimizers"][name] = value
        elif isinstance(value, torch.optim.lr_scheduler.LRScheduler):
            found["schedulers"][name] = value
    return found


def save_atomically(payload: dict[str, Any], path: Path) -> None:
    """torch.save to `path` atomically and durably (a killed writer leaves the old file)."""
    write_atomically(path, lambda f: torch.save(payload, f), durable=True)


def snapshot_state(obj: Any) -> Any:
    """A copy of a state dict that later training steps cannot change (tensors cloned to CPU)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot_state(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(snapshot_state(v) for v in obj)
    return obj


class CheckpointWriter:
    """Writes checkpoints on a background thread, one at a time and in order.

    The training thread only copies the states (fast); serialising and fsync, the slow part,
    overlap with the next steps. `wait()` returns when everything handed over is on disk (and
    re-raises a failed write), and is called before resuming, at the end of a run and on errors.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, payload: dict[str, Any], path: Path) -> None:
        self.wait()
        self._thread = threading.Thread(
            target=self._write, args=(payload, path), name="trainmate-checkpoint", daemon=True
        )
        self._thread.start()

    def _write(self, payload: dict[str, Any], path: Path) -> None:
        # Lowest CPU priority for this thread alone (Linux schedules threads as tasks): on a
        # machine whose cores the training saturates, the write yields to the training threads
        # and finishes in the gaps; it has until the next checkpoint.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            save_atomically(payload, path)
            prune(path.parent, self._keep)
        except BaseException as exc:  # handed to the training thread by wait()
            self._error = exc

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise TrainmateError(f"checkpoint not written: {error}") from None


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_atomically`; anything else is a one-line error."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise TrainmateError(f"{path}: no such checkpoint") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrainmateError(
            f"{path}: not a jupyter_trainmate checkpoint ({first[:160]})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise TrainmateError(f"{path}: not a jupyter_trainmate checkpoint (no format marker)")
    if payload.get("version") != VERSION:
        raise TrainmateError(
            f"{path}: checkpoint version {payload.get('version')} is not {VERSION}"
        )
    return payload


_NAME = re.compile(r"step-(\d+)(?:-epoch-(\d+)(-end)?)?")


def checkpoint_name(steps: int, epoch: int, position: int) -> str:
    """The file name of a checkpoint: the run's step count and the epoch it holds.

    `step-00000024-epoch-0002.pt` was taken during the 2nd epoch (0-based `epoch` 1, `position`
    batches into it); `step-00000032-epoch-0002-end.pt` when the 2nd epoch was complete (`epoch` 2,
    `position` 0: the next epoch starts fresh from it).
    """
    if position == 0:
        return f"step-{steps:08d}-epoch-{epoch:04d}-end.pt"
    return f"step-{steps:08d}-epoch-{epoch + 1:04d}.pt"


def _order(path: Path) -> tuple[int, int, int, int]:
    match = _NAME.fullmatch(path.stem)
    assert match is not None
    steps, epoch, end = match.groups()
    with contextlib.suppress(OSError):
        return (path.stat().st_mtime_ns, int(steps), int(epoch or 0), 1 if end else 0)
    return (0, int(steps), int(epoch or 0), 1 if end else 0)


def checkpoints(directory: Path) -> list[Path]:
    """The checkpoints in `directory`, oldest first.

    By the time each was written (a run started afresh in a folder of older checkpoints writes
    lower step counts, and its checkpoints are still the latest), then by the step and epoch in
    the name (writes within one clock tick). Names of earlier versions (`step-00000015.pt`, a
    count of saves) are read too.
    """
    found = [p for p in directory.glob("step-*.pt") if _NAME.fullmatch(p.stem)]
    return sorted(found, key=_order)


def prune(directory: Path, keep: int) -> None:
    for old in checkpoints(directory)[:-keep] if keep > 0 else []:
        with contextlib.suppress(OSError):
            old.unlink()
