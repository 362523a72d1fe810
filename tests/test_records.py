"""Run records: one JSON line per run beside the notebook, whatever the outcome."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from jupyter_trainmate.runtime.records import git_commit, read_records

from .train_harness import COMMON, fresh_shell, run

LOOP = """
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    jupyter_trainmate.log(val_loss=0.5 - 0.1 * epoch)
    sched.step()
"""


def test_a_finished_run_is_recorded_with_what_it_could_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook_dir = tmp_path / "project"
    notebook_dir.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=notebook_dir, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
                   cwd=notebook_dir, check=True)  # fmt: skip
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=notebook_dir, capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.setenv("JPY_SESSION_NAME", str(notebook_dir / "train.ipynb"))
    # the display thread never wakes in this run: the curve's points come from the epochs' ends
    monkeypatch.setattr("jupyter_trainmate.display.live.REFRESH_S", 3600.0)
    run([COMMON + "\nimport jupyter_trainmate\n", LOOP], "--display off")
    (record,) = read_records(notebook_dir / "runs")
    assert record["outcome"] == "finished"
    assert record["notebook"] == str(notebook_dir / "train.ipynb")
    assert record["git_commit"] == head
    assert record["versions"]["torch"] == torch.__version__
    assert record["options"]["display"] == "off"
    hyper = record["hyperparameters"]
    assert hyper["optimizers"] == {"opt": {"type": "SGD", "lr": pytest.approx(0.1 * 0.1**2)}}
    assert hyper["schedulers"] == {"sched": "StepLR"}
    assert hyper["batch_size"] == 32
    assert hyper["epochs"] == 2
    assert hyper["trained_parameters"] == 8 * 16 + 16 + 16 * 2 + 2
    assert record["metrics"] == {"val_loss": pytest.approx(0.4)}
    assert record["summary"]["steps"] == 16
    assert [step for step, _ in record["curves"]["loss"]] == [8, 16]  # one reading per epoch
    assert [step for step, _ in record["curves"]["val_loss"]] == [8, 16]


def test_failed_and_interrupted_runs_are_recorded_too(tmp_path: Path) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(
        "%%train --display off\nfor xb, yb in loader:\n    loss_fn(model(xb), yb).backward()\n    raise ValueError('x')\n"
    )
    ip.run_cell(
        "%%train --display off\nfor xb, yb in loader:\n    loss_fn(model(xb), yb).backward()\n    raise KeyboardInterrupt\n"
    )
    records = read_records(tmp_path / "runs")  # no notebook: the working directory (the test's)
    assert [r["outcome"] for r in records] == ["failed", "interrupted"]
    lines = (tmp_path / "runs" / "runs.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)


def test_a_torn_line_is_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "runs.jsonl").write_text('{"outcome": "finished"}\n{"outcome": "fini')
    assert read_records(folder) == [{"outcome": "finished"}]


def test_runs_table_and_idempotent_markdown(tmp_path: Path) -> None:
    from jupyter_trainmate.cli import main

    run([COMMON + "\nimport jupyter_trainmate\n", LOOP], "--display off")
    run([COMMON + "\nimport jupyter_trainmate\n", LOOP], "--display off --amp bf16")
    readme = tmp_path / "README.md"
    readme.write_text("# Experiments\n\nNotes above.\n")
    assert main(["runs", "--markdown", str(readme)]) == 0
    first = readme.read_text()
    assert first.startswith("# Experiments\n\nNotes above.\n")
    table = first.split("<!-- trainmate:runs:start -->\n")[1].split(
        "\n<!-- trainmate:runs:end -->"
    )[0]
    rows = table.splitlines()
    assert rows[0].startswith("| time | notebook | outcome |")
    assert len(rows) == 2 + 2
    assert "| finished | 2 | 16 |" in rows[2]
    assert "val_loss=0.4" in rows[3]
    assert main(["runs", "--markdown", str(readme)]) == 0
    assert readme.read_text() == first  # idempotent
    readme.write_text(first.replace("Notes above.", "Notes changed."))
    main(["runs", "--markdown", str(readme)])
    assert "Notes changed." in readme.read_text()
    assert readme.read_text().count("<!-- trainmate:runs:start -->") == 1


def test_runs_table_from_the_magic(capsys: pytest.CaptureFixture[str]) -> None:
    ip = run([COMMON + "\nimport jupyter_trainmate\n", LOOP], "--display off")
    capsys.readouterr()
    ip.run_line_magic("trainmate", "runs")
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["time", "notebook", "outcome"]
    assert "finished" in out[1]


def test_tensorboard_events_hold_the_loss_and_the_logged_metrics(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    slow = COMMON + "\nimport jupyter_trainmate, time\n"
    loop = LOOP.replace("opt.step()", "opt.step()\n        time.sleep(0.01)")  # ~1.6 s: readings
    run([slow, loop], "--display off --tensorboard on")
    (record,) = read_records(tmp_path / "runs")
    folder = Path(record["tensorboard"])
    assert folder.parent == tmp_path / "runs" / "tensorboard"
    events = EventAccumulator(str(folder))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/samples_per_s", "metrics/val_loss"} <= set(scalars)
    val = [(e.step, round(e.value, 4)) for e in events.Scalars("metrics/val_loss")]
    assert val == [(8, 0.5), (16, 0.4)]  # logged after each epoch's 8 steps
    losses = events.Scalars("train/loss")
    assert losses
    assert all(0 < e.value < 10 and 0 < e.step <= 16 for e in losses)


def test_tensorboard_off_writes_nothing(tmp_path: Path) -> None:
    run([COMMON + "\nimport jupyter_trainmate\n", LOOP], "--display off --tensorboard off")
    (record,) = read_records(tmp_path / "runs")
    assert record["tensorboard"] is None
    assert not (tmp_path / "runs" / "tensorboard").exists()


def test_tensorboard_on_without_the_package_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    ip = fresh_shell()
    ip.run_cell(COMMON + "\nimport jupyter_trainmate\n").raise_error()
    result = ip.run_cell(f"%%train --tensorboard on --display off\n{LOOP}")
    assert "tensorboard package is not installed" in str(result.error_in_exec)


def test_git_commit_is_found_from_a_subfolder_a_worktree_and_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def git(*args: str, cwd: Path) -> str:
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout

    repo = tmp_path / "repo"
    (repo / "notebooks" / "deep").mkdir(parents=True)
    git("init", "-q", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", "x", cwd=repo)
    head = git("rev-parse", "HEAD", cwd=repo).strip()
    assert git_commit(repo / "notebooks" / "deep") == head
    git("worktree", "add", "-q", "-b", "other", str(tmp_path / "wt"), cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", "y", cwd=tmp_path / "wt")  # a gitdir: file
    other = git("rev-parse", "HEAD", cwd=tmp_path / "wt").strip()
    assert other != head
    assert git_commit(tmp_path / "wt") == other
    monkeypatch.chdir(repo)
    assert git_commit(Path("notebooks")) == head
    assert git_commit("notebooks/deep") == head
    assert git_commit(tmp_path) != head  # the repository is below it, not above
