"""What a sweep pays per sweep and per trial (issue 15, round 3): the study's name looked up one
name at a time, Optuna's verbosity set only when it differs, no status file written at the
sweep's end just before it is removed, a model's snapshot loaded without a copy first; and each
trial its own TensorBoard run. No timing: each
test checks the behaviour the change keeps or makes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from jupyter_trainmate import TrainmateError
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.runtime.status import ended_dir
from jupyter_trainmate.sweep.driver import _pick_name, trial_name
from jupyter_trainmate.sweep.notice import SweepNotice
from jupyter_trainmate.sweep.space import Snapshot
from jupyter_trainmate.sweep.summary import SweepSummary, last_sweep

from .test_sweep import SUGGEST_CELL, shell, sweep
from .train_harness import status_writes


def last() -> SweepSummary:
    summary = last_sweep()
    assert summary is not None
    return summary


def test_a_study_name_is_picked_by_looking_up_names_one_at_a_time() -> None:
    existing = {"nb-1", "nb-1-2", "nb-1-3", "other"}
    asked: list[str] = []

    def exists(name: str) -> bool:
        asked.append(name)
        return name in existing

    assert _pick_name("nb-1", exists, resume=False, explicit=False) == "nb-1-4"
    assert asked == ["nb-1", "nb-1-2", "nb-1-3", "nb-1-4"]  # never "other"
    assert _pick_name("nb-1", exists, resume=True, explicit=False) == "nb-1-3"
    assert _pick_name("new", exists, resume=False, explicit=False) == "new"
    with pytest.raises(TrainmateError, match=r"already in runs/optuna\.journal"):
        _pick_name("nb-1", exists, resume=False, explicit=True)
    with pytest.raises(TrainmateError, match="no study 'new'"):
        _pick_name("new", exists, resume=True, explicit=True)


def test_sweeps_of_one_cell_read_no_list_of_every_study(monkeypatch: pytest.MonkeyPatch) -> None:
    """`get_all_study_names` deep-copies every study of the journal: the driver asks the storage
    about the names it tries instead, and still makes `-2` and resumes it."""

    def refuse(*args: object, **kwargs: object) -> list[str]:
        raise AssertionError("every study's name was read")

    monkeypatch.setattr(optuna.study, "get_all_study_names", refuse)
    monkeypatch.setattr(optuna, "get_all_study_names", refuse)
    ip = shell()
    sweep(ip, "--sweep 1 --monitor val --seed 0 --sampler random", SUGGEST_CELL)
    first = last().study
    sweep(ip, "--sweep 1 --monitor val --seed 0 --sampler random", SUGGEST_CELL)
    assert last().study == f"{first}-2"
    sweep(ip, "--sweep 2 --monitor val --seed 0 --sampler random --resume", SUGGEST_CELL)
    assert last().study == f"{first}-2"
    assert [t.state for t in last().trials] == ["complete", "complete"]


def test_a_sweep_sets_optunas_verbosity_only_when_it_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ip = shell()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    sweep(ip, "--sweep 1 --monitor val --seed 0 --sampler random", SUGGEST_CELL)
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING  # quiet trials, as before
    calls: list[int] = []
    monkeypatch.setattr(optuna.logging, "set_verbosity", calls.append)
    sweep(ip, "--sweep 1 --monitor val --seed 0 --sampler random", SUGGEST_CELL)
    assert calls == []  # already WARNING: every logger's cache is left alone


def test_the_sweeps_end_writes_no_status_file_before_removing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    notice = SweepNotice("s", 2, TrainOptions(sweep=2, monitor="val"), None)
    status = notice.status
    assert status is not None
    notice.trial(1)
    writes = status_writes(monkeypatch)
    notice.end("finished", None)
    assert writes == []
    assert not status.path.exists()
    ended = json.loads((ended_dir(status.directory) / status.path.name).read_text())
    assert ended["run_name"] == "sweep s: 0 trial(s)"  # the final name, in the ended record
    assert ended["outcome"] == "finished"
    assert ended["sweep"] == {"study": "s", "trials": 0}


def test_each_trial_is_a_tensorboard_run_of_its_own() -> None:
    """Trials of a short loop start within a second of each other: with the batch loop's name
    they shared one folder (`<time>-loader`), which TensorBoard shows as one run."""
    pytest.importorskip("tensorboard")
    ip = shell()
    ip.run_cell(
        "%%train --display text --tensorboard on --sweep 3 --monitor val --seed 0 "
        f"--sampler random --study s\n{SUGGEST_CELL}"
    ).raise_error()
    folders = sorted((Path("runs") / "tensorboard").iterdir())
    assert [f.name.split("-", 2)[2] for f in folders] == [trial_name("s", n) for n in range(3)]
    for folder in folders:
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    records = [json.loads(line) for line in (Path("runs") / "runs.jsonl").read_text().splitlines()]
    assert [Path(r["tensorboard"]).name for r in records] == [f.name for f in folders]
    assert [r["sweep"]["trial"] for r in records] == [0, 1, 2]


class _Counter(torch.nn.Module):
    """A module whose extra state is an object it keeps and changes in place."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, int] = {"batches": 0}
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen["batches"] += 1
        return self.linear(x)

    def get_extra_state(self) -> dict[str, int]:
        return self.seen

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.seen = state


def test_each_restore_gives_the_snapshots_state_which_training_never_changes() -> None:
    """A model's state is loaded without a copy first (`load_state_dict` copies it in); the
    optimizer's (tensors it keeps as its own) and a module's extra state are still copied."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    counter = _Counter()
    opt = torch.optim.SGD([*model.parameters(), *counter.parameters()], lr=0.1, momentum=0.9)
    x = torch.randn(16, 4)

    def train(steps: int) -> None:
        for _ in range(steps):
            opt.zero_grad()
            (model(x).sum() + counter(x).sum()).backward()
            opt.step()

    train(1)  # momentum buffers exist: the optimizer's state has tensors
    namespace = {"model": model, "counter": counter, "opt": opt}
    snapshot = Snapshot.take(namespace)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    results = []
    for _ in range(2):
        snapshot.restore(namespace)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in start.items())
        assert counter.seen == {"batches": 1}
        train(3)
        results.append({k: v.clone() for k, v in model.state_dict().items()})
    assert all(torch.equal(results[0][k], results[1][k]) for k in start)  # bit-identical
    assert all(not torch.equal(results[0][k], start[k]) for k in start)  # it did train
    saved = snapshot.states["models"]
    assert all(torch.equal(saved["model"][k], v) for k, v in start.items())  # untouched
    assert saved["counter"]["_extra_state"] == {"batches": 1}


class _Keeper(torch.nn.Linear):
    """A module with a `load_state_dict` of its own that keeps the dict it is given."""

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        self.kept = state_dict
        return super().load_state_dict(state_dict, strict, assign)


def test_a_model_with_its_own_load_state_dict_gets_a_copy_of_the_snapshot() -> None:
    keeper, plain = _Keeper(2, 2), torch.nn.Linear(2, 2)
    namespace = {"keeper": keeper, "plain": plain}
    snapshot = Snapshot.take(namespace)
    snapshot.restore(namespace)
    assert keeper.kept is not snapshot.states["models"]["keeper"]
    assert torch.equal(keeper.kept["weight"], snapshot.states["models"]["keeper"]["weight"])


def test_a_load_hook_or_a_loader_of_its_own_below_the_model_means_a_copy() -> None:
    from jupyter_trainmate.sweep.space import _copied_in

    class OwnLoader(torch.nn.Linear):
        def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
            super()._load_from_state_dict(*args, **kwargs)

    plain = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    assert _copied_in(plain, plain.state_dict())  # torch's own loaders (BatchNorm's too)
    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), OwnLoader(2, 2))
    assert not _copied_in(inner, inner.state_dict())
    hooked = torch.nn.Sequential(torch.nn.Linear(2, 2))
    kept: list[Any] = []
    hooked[0].register_load_state_dict_post_hook(lambda module, keys: kept.append(module))
    assert not _copied_in(hooked, hooked.state_dict())
