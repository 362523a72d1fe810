"""What a run undoes after the cell: every undo runs, the cell's own exception is the one raised,
a failed finaliser is an event of the run (display and record), and the record is always written;
a display that fails to draw says so once and gives way to the text view."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError

import jupyter_trainmate.runtime.checkpoint as checkpoint_module
from jupyter_trainmate import last_run
from jupyter_trainmate.display.live import LiveDisplay, Throttle
from jupyter_trainmate.display.views import TextView, WidgetView
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.runtime.records import read_records
from jupyter_trainmate.runtime.session import TrainSession

from .train_harness import COMMON, fresh_shell

LOOP = """
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
        FAIL_AT -= 1
        if FAIL_AT == 0:
            raise FAILURE
"""


@pytest.fixture
def disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every checkpoint write fails (the writer thread hands the error to `wait()`)."""

    def fail(payload: object, path: Path) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint_module, "save_atomically", fail)


@pytest.mark.parametrize(
    "failure", ["ValueError('the cell failed')", "KeyboardInterrupt"], ids=["error", "interrupt"]
)
@pytest.mark.usefixtures("disk_full")
def test_a_failed_checkpoint_write_keeps_the_cells_exception_and_writes_the_record(
    failure: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON + f"\nFAIL_AT = 5\nFAILURE = {failure}\n").raise_error()
    result = ip.run_cell(f"%%train --checkpoint {tmp_path / 'ckpt'} --display text\n{LOOP}")
    expected = ValueError if failure.startswith("ValueError") else KeyboardInterrupt
    assert type(result.error_in_exec) is expected  # not the writer's error
    assert "__trainmate__" not in ip.user_ns  # every undo ran
    (record,) = read_records(tmp_path / "runs")
    assert record["outcome"] == ("failed" if expected is ValueError else "interrupted")
    failed = [e for e in record["summary"]["events"] if "checkpoint not written" in e]
    assert failed
    assert "No space left on device" in failed[0]
    summary = last_run()
    assert summary is not None
    assert summary.events == tuple(record["summary"]["events"])
    out = capsys.readouterr().out
    assert "checkpoint not written: No space left on device" in out  # the text view's event line


@pytest.mark.usefixtures("disk_full")
def test_a_finished_run_whose_checkpoint_failed_is_recorded_then_fails(tmp_path: Path) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON + "\nFAIL_AT = -1\nFAILURE = None\n").raise_error()
    one_epoch = LOOP.replace("range(2)", "range(1)")  # its one checkpoint fails after the cell
    with pytest.raises(UsageError, match="checkpoint not written: No space left on device"):
        ip.run_cell(
            f"%%train --checkpoint {tmp_path / 'ckpt'} --display off\n{one_epoch}"
        ).raise_error()
    (record,) = read_records(tmp_path / "runs")
    assert record["outcome"] == "finished"
    assert record["summary"]["steps"] == 8
    assert any("checkpoint not written" in e for e in record["summary"]["events"])


WAIT_FOR_DISPLAY = """
import time
for xb, yb in loader:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not any("display" in e for e in __trainmate__.events):
    time.sleep(0.05)  # until the display thread has tried to draw
"""


@pytest.mark.parametrize("mode", ["widget", "text"])
def test_a_display_that_fails_to_draw_shows_its_event_and_the_run_completes(
    mode: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def cannot_draw(self: object, snap: object) -> None:
        raise RuntimeError("cannot draw")

    monkeypatch.setattr(WidgetView if mode == "widget" else TextView, "update", cannot_draw)
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(f"%%train --display {mode}\n{WAIT_FOR_DISPLAY}").raise_error()
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    assert summary.steps == 8
    (event,) = [e for e in summary.events if e.startswith("display:")]  # reported once
    assert "drawing failed (RuntimeError: cannot draw)" in event
    out = capsys.readouterr().out
    assert summary.line() in out
    assert f"[%%train loader] {event}" in out  # the text view (or the summary) shows it


def test_a_failing_widget_gives_way_to_the_text_view_and_notes_why() -> None:
    session = TrainSession(TrainOptions(), {"model": torch.nn.Linear(2, 2)})
    live = LiveDisplay(session, "widget", "%%train test")
    widget = live.view
    assert isinstance(widget, WidgetView)

    def cannot_draw(snap: object) -> None:
        raise ValueError("bad SVG")

    widget.update = cannot_draw  # type: ignore[method-assign]
    redraw = live.tick(0.0, Throttle(0.0), Throttle(0.0))
    assert isinstance(live.view, TextView)
    assert redraw.interval == live.view.interval
    message = "display: drawing failed (ValueError: bad SVG); the text view takes over"
    assert session.events == [message]
    assert live.state.events == [message]
    assert "drawing failed (ValueError: bad SVG)" in widget.notes.value
    live.view = TextView("%%train test", stream=io.StringIO())

    def text_fails(snap: object) -> None:
        raise OSError("stdout closed")

    live.view.update = text_fails  # type: ignore[method-assign]
    live.tick(100.0, redraw, Throttle(0.0))
    assert live.view is None  # the summary line alone from here
    assert len(session.events) == 1  # reported once
