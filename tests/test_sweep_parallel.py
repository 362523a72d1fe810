"""`%%train --sweep N --parallel K`: trials in spawned worker processes sharing the journal (CPU)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import optuna
import psutil
import pytest
import torch
from IPython.core.error import UsageError

import jupyter_trainmate
from jupyter_trainmate import TrainmateError
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.sweep.parallel import worker_devices, worker_seed
from jupyter_trainmate.sweep.storage import PROCESS, open_storage

from .test_sweep import FAST, SUGGEST_CELL, shell


def test_two_workers_share_the_journal_and_leave_the_notebooks_objects_alone(
    tmp_path: Path,
) -> None:
    ip = shell()
    model = ip.user_ns["model"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ip.run_cell(
        f"%%train {FAST} --sweep 4 --parallel 2 --monitor val --study par --seed 3 --prune none "
        f"--checkpoint {tmp_path / 'ck'}\n" + SUGGEST_CELL
    ).raise_error()
    summary = jupyter_trainmate.last_sweep()
    assert summary is not None
    assert summary.study == "par"
    assert [t.state for t in summary.trials] == ["complete"] * 4
    assert summary.best_trial is not None
    assert summary.best_value == min(t.value for t in summary.trials if t.value is not None)
    # the best trial's weights, checkpointed by its worker
    best = summary.best_trial.checkpoint
    assert best is not None
    assert Path(best).is_file()
    assert f"par-trial-{summary.best_trial.number:03d}" in best
    # each worker ran trials: two processes signed them, neither of them this one
    study = optuna.load_study(study_name="par", storage=open_storage(Path("runs/optuna.journal")))
    pids = {t.user_attrs[PROCESS]["pid"] for t in study.trials}
    assert len(pids) == 2
    assert os.getpid() not in pids
    # each trial's run record, written by its worker, names its study and trial
    lines = (Path("runs") / "runs.jsonl").read_text().splitlines()
    sweeps = [json.loads(line)["sweep"] for line in lines]
    assert sorted(s["trial"] for s in sweeps) == [0, 1, 2, 3]
    assert {s["study"] for s in sweeps} == {"par"}
    # the notebook's model is the one it had, untrained (the workers trained their copies)
    assert ip.user_ns["model"] is model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert "__trainmate__" not in ip.user_ns


def test_an_unsendable_variable_is_refused_in_one_line_before_any_worker_starts() -> None:
    ip = shell("log = open('train.log', 'w')\n")
    cell = "log.write('trial')\n" + SUGGEST_CELL
    result = ip.run_cell(f"%%train {FAST} --sweep 2 --parallel 2 --monitor val --study u\n{cell}")
    error = result.error_in_exec
    assert isinstance(error, UsageError)
    assert str(error) == (
        "%%train: --parallel: cannot send 'log' to the workers: a file open for writing "
        "(TextIOWrapper)"
    )
    ip.user_ns["log"].close()
    # the study made for it is gone again: no trial, nothing to resume
    storage = open_storage(Path("runs/optuna.journal"))
    assert "u" not in {s.study_name for s in optuna.get_all_study_summaries(storage)}


def test_one_gpu_per_worker_else_a_share_of_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert worker_devices(3) == (["4", "6", "4"], None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert worker_devices(2) == (["0", "1"], None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    assert worker_devices(3) == ([None, None, None], 2)


def test_workers_get_their_own_seeds_but_the_grid_one_for_all() -> None:
    tpe = TrainOptions(sweep=4, monitor="val", parallel=2, seed=7)
    assert [worker_seed(tpe, i, 99) for i in range(2)] == [7, 8]
    unseeded = dataclasses.replace(tpe, seed=None)
    assert [worker_seed(unseeded, i, 99) for i in range(2)] == [None, None]
    grid = dataclasses.replace(tpe, sampler="grid")  # trial n is the grid's n-th point
    assert [worker_seed(grid, i, 99) for i in range(2)] == [99, 99]
    with pytest.raises(TrainmateError, match="--parallel 2: only with --sweep N"):
        TrainOptions(parallel=2)


def test_ctrl_c_stops_the_workers_and_marks_their_trials() -> None:
    ip = shell("import time\n")
    cell = (
        'lr = jupyter_trainmate.suggest("lr", 1e-3, 0.5, log=True)\n'
        "for epoch in range(600):\n"
        "    time.sleep(0.1)\n"
        "    jupyter_trainmate.log(val=lr)\n"
    )
    journal = Path("runs/optuna.journal")

    def interrupt_when_both_run() -> None:  # Ctrl-C once each worker is inside a trial
        for _ in range(1200):
            time.sleep(0.1)
            if journal.exists():
                storage = open_storage(journal)
                with contextlib.suppress(KeyError):
                    study = optuna.load_study(study_name="c", storage=storage)
                    running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                    if len(running) == 2 and all(PROCESS in t.user_attrs for t in running):
                        os.kill(os.getpid(), signal.SIGINT)
                        return

    watcher = threading.Thread(target=interrupt_when_both_run, daemon=True)
    watcher.start()
    result = ip.run_cell(
        f"%%train {FAST} --sweep 4 --parallel 2 --monitor val --study c --prune none\n{cell}"
    )
    watcher.join()
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    summary = jupyter_trainmate.last_sweep()
    assert summary is not None
    assert [t.state for t in summary.trials] == ["failed", "failed"]
    assert {t.reason for t in summary.trials} == {"interrupted (Ctrl-C)"}
    assert summary.stopped == "interrupted (Ctrl-C)"
    study = optuna.load_study(study_name="c", storage=open_storage(journal))
    for trial in study.trials:  # the workers are gone
        assert not psutil.pid_exists(trial.user_attrs[PROCESS]["pid"])
