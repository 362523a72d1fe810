"""Round 6 of issue 14: what a run pays per run, made cheaper without changing what it does: the
status file and the TensorBoard reading on the once-a-second schedule from the run's start, the
runtime folder and the CPU count read once; and a batch loop's body in progress, seen however its
loop ends (no timing here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from jupyter_trainmate.display.live import LiveDisplay, Throttle
from jupyter_trainmate.monitor.host import shared_host
from jupyter_trainmate.runtime import status as status_module
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.runtime.session import TrainSession


def _session(namespace: dict[str, Any]) -> TrainSession:
    return TrainSession(TrainOptions(), namespace)


def test_a_batch_in_hand_is_seen_however_its_loop_ends() -> None:
    session = _session({})
    batches = session._batches
    data = [(torch.zeros(2, 3), torch.zeros(2)) for _ in range(4)]
    assert not bool(batches._in_batch)
    seen = []
    for _ in session.batches(data):
        seen.append(bool(batches._in_batch))
        inner = [bool(batches._in_batch) for _ in session.batches(data[:2])]
        assert inner == [True, True]
        seen.append(
            bool(batches._in_batch)
        )  # the inner loop ended: the outer batch is still in hand
        break
    assert seen == [True, True]
    assert not bool(batches._in_batch)  # left by `break`

    def fails() -> None:
        for _ in session.batches(data):
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fails()
    assert not bool(batches._in_batch)  # left by an exception
    assert list(session.loop(range(2))) == [0, 1]
    kept = iter(session.batches(data))
    next(kept)  # a pass left suspended holds its batch, as the counter did
    assert bool(batches._in_batch)
    assert session.loop(range(3)) == range(3)  # inside a batch: returned as is
    kept.close()
    assert not bool(batches._in_batch)


class _Status:
    active = True

    def __init__(self) -> None:
        self.writes = 0

    def write(self) -> None:
        self.writes += 1


class _Board:
    def __init__(self) -> None:
        self.readings = 0

    def progress(self, progress: object) -> None:
        self.readings += 1


def test_status_file_and_tensorboard_once_a_second_from_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status, board = _Status(), _Board()
    live = LiveDisplay(
        _session({}),
        "off",
        status=status,  # type: ignore[arg-type]
        tensorboard=board,  # type: ignore[arg-type]
    )
    samples: list[int] = []
    monkeypatch.setattr(live.sampler, "sample_once", lambda: samples.append(1))
    start = 100.0
    live.writes.ready(start)  # as `_loop` does when the thread starts (the status's first write)
    redraw, sample = Throttle(float("inf")), Throttle(1.0)
    live.tick(start + 0.25, redraw, sample)  # the first tick: a device reading, nothing written
    assert (len(samples), status.writes, board.readings) == (1, 0, 0)
    live.tick(start + 0.5, redraw, sample)
    assert (len(samples), status.writes, board.readings) == (1, 0, 0)
    live.tick(start + 1.0, redraw, sample)  # a second after the start: both written
    assert (status.writes, board.readings) == (1, 1)
    live.tick(start + 1.25, redraw, sample)  # the next device reading, a second after the first
    assert (len(samples), status.writes, board.readings) == (2, 1, 1)


def test_the_runtime_folder_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "a"))
    assert status_module.status_dir() == tmp_path / "a" / status_module.STATUS_SUBDIR
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "b"))
    assert status_module.status_dir() == tmp_path / "b" / status_module.STATUS_SUBDIR
    monkeypatch.delenv("JUPYTER_RUNTIME_DIR")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    assert status_module.status_dir() == tmp_path / "data" / "runtime" / "trainmate-runs"


def test_the_advice_counts_the_cpus_the_host_source_allows() -> None:
    live = LiveDisplay(_session({}), "off")
    assert live.measurements().cpus == shared_host().cpus() >= 1
