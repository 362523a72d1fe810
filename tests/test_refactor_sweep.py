"""A notebook whose training cell is `%%train --sweep 3` becomes a package with `python -m PKG
sweep --trials N` (the same study: trials of the cell's function in `runs/optuna.journal`) and a
`train` command that runs the cell once with each `suggest()` giving its default."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import jupyter_trainmate
from jupyter_trainmate import runner
from jupyter_trainmate.errors import TrainmateError
from jupyter_trainmate.refactor.project import main_module, sweep_default
from jupyter_trainmate.runtime.options import TrainOptions, parse_options
from jupyter_trainmate.sweep.function import no_sweep, requested, sweep_trials

NOTEBOOKS = Path(__file__).parent / "notebooks"
PACKAGE = "sweep_mlp"
STUDY = "train_cell_7"  # the function the refactor made of the notebook's cell 7


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / PACKAGE
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_trainmate", "refactor", NOTEBOOKS / f"{PACKAGE}.ipynb",
         "-o", str(out), "--no-docs"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def run_package(package: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def records(folder: Path) -> list[dict[str, object]]:
    path = folder / "runs" / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_cells_sweep_becomes_a_sweep_command(package: Path) -> None:
    main = (package / PACKAGE / "__main__.py").read_text()
    assert '"sweep"' in main
    assert "default=3" in main  # the cell's --sweep 3
    help_text = run_package(package, package, "sweep", "--help").stdout
    assert "--trials" in help_text
    assert "--parallel" in help_text
    assert "--epochs" in help_text


def test_sweep_runs_the_trials_of_one_study_and_train_runs_once(
    package: Path, tmp_path: Path
) -> None:
    import optuna
    from optuna.trial import TrialState

    from jupyter_trainmate.sweep import storage

    proc = run_package(package, tmp_path, "sweep", "--trials", "3")
    assert f"trainmate sweep {STUDY}: 3 trial(s)" in proc.stdout
    assert "trained with lr" not in proc.stdout  # the command ends after the study
    journal = storage.open_storage(tmp_path / "runs" / storage.JOURNAL)
    assert [s.study_name for s in optuna.get_all_study_summaries(journal)] == [STUDY]
    trials = optuna.load_study(study_name=STUDY, storage=journal).trials
    assert len(trials) == 3
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    lrs = [t.params["lr"] for t in trials]
    assert all(1e-3 <= lr <= 1e-1 for lr in lrs)
    assert len(set(lrs)) == 3
    sweep_records = records(tmp_path)
    assert len(sweep_records) == 3
    assert [r["sweep"]["trial"] for r in sweep_records] == [0, 1, 2]  # type: ignore[index]

    proc = run_package(package, tmp_path, "train")
    assert "trainmate sweep" not in proc.stdout
    assert proc.stdout.count("trained with lr") == 1
    lr = float(proc.stdout.split("trained with lr ")[1].split()[0])
    assert math.isclose(lr, 1e-2)  # suggest()'s default: the geometric middle of 1e-3..1e-1
    after = records(tmp_path)
    assert len(after) == 4
    assert "sweep" not in after[-1]
    assert len(optuna.load_study(study_name=STUDY, storage=journal).trials) == 3  # untouched


def test_a_notebook_without_a_sweep_gets_no_sweep_command() -> None:
    assert sweep_default(["--amp bf16", "--sweep 5 --monitor loss", "--sweep 2 --monitor x"]) == 5
    assert sweep_default(["--amp bf16", "--bogus"]) is None
    plain = main_module("pkg", "Title")
    assert '"sweep"' not in plain
    assert "no_sweep" not in plain
    with_sweep = main_module("pkg", "Title", sweep=4)
    assert "default=4" in with_sweep
    assert "with no_sweep():" in with_sweep
    compile(with_sweep, "__main__.py", "exec")


def test_requests_set_the_trials_of_a_train_call() -> None:
    options = parse_options(
        "--sweep 3 --monitor val_loss --seed 1 --prune none --parallel 3 --resume"
    )
    assert requested(options) == options
    with sweep_trials(7, 2):
        swept = requested(options)
    assert (swept.sweep, swept.parallel, swept.seed) == (7, 2, 1)
    with sweep_trials(5):
        assert requested(options).parallel == 3  # the options' own
    with no_sweep():
        once = requested(options)
    assert (once.sweep, once.monitor, once.seed) == (None, None, None)
    assert (once.prune, once.parallel, once.resume) == (TrainOptions().prune, 1, False)

    def fit() -> None:
        raise AssertionError("must not run")

    with pytest.raises(TrainmateError, match="nothing to search"):
        jupyter_trainmate.train(fit, "--sweep 3 --monitor val_loss")
    with pytest.raises(TrainmateError, match=r"runs through jupyter_trainmate\.train"):
        runner.train(fit, "--sweep 3 --monitor val_loss")  # without the sweep's hooks
