"""Checkpoint files are named by the step and epoch they hold; `--resume` finds the latest."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from jupyter_trainmate.runtime.checkpoint import checkpoint_name, checkpoints, load

from .test_lifecycle import LOOP, interrupt_then_resume
from .train_harness import COMMON, run


def test_names_say_the_step_and_the_epoch() -> None:
    assert checkpoint_name(24, 1, 3) == "step-00000024-epoch-0002.pt"  # 3 batches into epoch 2
    assert checkpoint_name(32, 2, 0) == "step-00000032-epoch-0002-end.pt"  # epoch 2 complete


def touch(folder: Path, name: str, mtime_s: int) -> Path:
    path = folder / name
    path.write_bytes(b"")
    os.utime(path, ns=(mtime_s * 10**9, mtime_s * 10**9))
    return path


def test_the_latest_is_the_last_written_then_the_furthest(tmp_path: Path) -> None:
    old = touch(tmp_path, "step-00000015.pt", 1000)  # a name of earlier versions (a save count)
    touch(tmp_path, "notes.pt", 3000)
    touch(tmp_path, "step-00000015-old.pt", 3000)
    mid = touch(tmp_path, "step-00000024-epoch-0003.pt", 2000)
    end = touch(tmp_path, "step-00000024-epoch-0003-end.pt", 2000)  # same tick: by the name
    fresh = touch(tmp_path, "step-00000004-epoch-0001.pt", 2500)  # a new run in the same folder
    assert checkpoints(tmp_path) == [old, mid, end, fresh]


def test_each_checkpoint_holds_the_step_and_epoch_its_name_says(tmp_path: Path) -> None:
    setup = COMMON + "\nstep_counter = 0\nSTOP_BEFORE_FORWARD = STOP_AFTER_STEP = -1\n"
    run([setup, LOOP], f"--checkpoint {tmp_path} --every 5 --keep 100 --display off")
    names = [p.name for p in checkpoints(tmp_path)]
    assert names == [
        "step-00000005-epoch-0001.pt",
        "step-00000008-epoch-0001-end.pt",
        "step-00000010-epoch-0002.pt",
        "step-00000015-epoch-0002.pt",
        "step-00000016-epoch-0002-end.pt",
        "step-00000020-epoch-0003.pt",
        "step-00000024-epoch-0003-end.pt",
    ]
    for path in checkpoints(tmp_path):
        payload = load(path)
        steps, epoch, end = re.fullmatch(r"step-(\d+)-epoch-(\d+)(-end)?", path.stem).groups()  # type: ignore[union-attr]
        assert payload["steps"] == int(steps)
        if end:
            assert (payload["epoch"], payload["position"]) == (int(epoch), 0)
        else:
            assert payload["epoch"] == int(epoch) - 1
            assert payload["position"] == int(steps) - 8 * (int(epoch) - 1)


def test_a_resumed_run_counts_its_steps_on_from_the_checkpoint(tmp_path: Path) -> None:
    line = f"--checkpoint {tmp_path} --keep 100 --display off"
    interrupt_then_resume(-1, 13, line)
    latest = checkpoints(tmp_path)[-1]
    assert latest.name == "step-00000024-epoch-0003-end.pt"
    assert load(latest)["steps"] == 24
    assert torch.is_tensor(load(latest)["rng"]["torch"])
