"""A `%%train` run's status file is first written at the run's first second, by the display
thread (`StatusWriter.start_later`): a shorter run writes none and removes none, and still leaves
its ended record. A runtime folder that cannot be written leaves no entry and no report, as
before. No timing: each test checks what is on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_trainmate.runtime.status import StatusWriter
from jupyter_trainmate.runtime.summary import RunProgress

from .train_harness import COMMON, fresh_shell

SEEN = """
import os, pathlib, time
for epoch in range(2):
    for i, (xb, yb) in enumerate(loader):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
        if epoch == 1 and i == 0:
            runs = pathlib.Path(os.environ["JUPYTER_RUNTIME_DIR"]) / "trainmate-runs"
            early = sorted(p.name for p in runs.glob("*.json"))
            time.sleep(WAIT)
            late = sorted(p.name for p in runs.glob("*.json"))
"""


def _run(wait: float, options: str = "--display off --tensorboard off") -> dict[str, object]:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(f"%%train {options}\n{SEEN.replace('WAIT', str(wait))}").raise_error()
    return ip.user_ns


def _record() -> dict[str, object]:
    [record] = [json.loads(x) for x in Path("runs/runs.jsonl").read_text().splitlines()]
    return record


def test_a_short_run_writes_no_status_file_but_its_ended_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_trainmate.display import live

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(live, "SAMPLE_S", 3600.0)  # shorter than its first second on any machine
    seen = _run(0)
    assert seen["early"] == []
    assert seen["late"] == []
    assert not (tmp_path / "trainmate-runs").exists()  # nothing made, nothing removed
    [ended] = (tmp_path / "trainmate-ended").iterdir()
    assert json.loads(ended.read_text())["outcome"] == "finished"


def test_a_run_past_its_first_second_shows_in_the_sidebar_and_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    seen = _run(1.6)
    assert seen["early"] == []  # before its first second
    [name] = seen["late"]  # type: ignore[misc]
    assert list((tmp_path / "trainmate-runs").glob("*.json")) == []  # removed at the end
    [ended] = (tmp_path / "trainmate-ended").iterdir()
    assert ended.name == name  # the same run
    assert _record()["summary"]["events"] == []  # type: ignore[index]


@pytest.mark.parametrize("wait", [0, 1.3])
def test_a_runtime_folder_that_cannot_be_written_leaves_no_entry_and_no_report(
    wait: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the runtime folder would be")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(blocked))
    _run(wait)
    record = _record()
    assert record["outcome"] == "finished"
    assert record["summary"]["events"] == []  # type: ignore[index]
    assert "status file" not in capsys.readouterr().out
    assert blocked.read_text() == "a file where the runtime folder would be"


def _progress() -> RunProgress:
    return RunProgress(
        steps=0, samples=0, optimizer_steps=0, epoch=1, epochs_total=None, step_in_epoch=0,
        steps_per_epoch=None, fraction=None, eta_s=None, wall_s=0.0, samples_per_s=0.0,
        steps_per_s=0.0, data_wait_share=0.0, last_loss=None, device="cpu", amp="off",
    )  # fmt: skip


def test_start_still_writes_at_once_and_raises(tmp_path: Path) -> None:
    """A sweep's and a `--procs` launch's status file (`start`): there from the start."""
    status = StatusWriter(_progress, notebook=None, run_name="r", directory=tmp_path / "runs")
    status.start()
    assert status.path.exists()
    status.stop()
    assert not status.path.exists()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(OSError, match="Not a directory"):
        StatusWriter(_progress, notebook=None, run_name="r", directory=blocked / "runs").start()
