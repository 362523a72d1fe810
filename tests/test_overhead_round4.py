"""Round 4 of issue 14: the display thread's work per run and the optimizer step hook, made
cheaper without changing what they do: no snapshot before the text view can print, the status
file from the progress's fields directly, the CPU count from the cgroup quota read once, the
step hook a closure that still counts every step until the run closes."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from jupyter_trainmate.display.live import LiveDisplay, Throttle
from jupyter_trainmate.display.views import TextView, WidgetView
from jupyter_trainmate.monitor.host import HostSource, usable_cpus
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.runtime.session import TrainSession
from jupyter_trainmate.runtime.status import StatusWriter


def _text_display(stream: io.StringIO) -> tuple[LiveDisplay, TextView]:
    session = TrainSession(TrainOptions(), {"model": torch.nn.Linear(2, 2)})
    live = LiveDisplay(session, "text", "%%train test")
    view = TextView("%%train test", stream=stream)
    live.view = view
    return live, view


def test_the_text_view_gets_no_snapshot_before_its_first_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    live, view = _text_display(out)
    snapshots: list[int] = []
    real = live.snapshot

    def counted(summary: object = None) -> object:
        snapshots.append(1)
        return real()

    monkeypatch.setattr(live, "snapshot", counted)
    redraw = live.first_redraw()
    assert redraw.interval == view.interval
    never = Throttle(float("inf"))
    never.ready(0.0)
    for now in (0.25, 0.5, view.interval - 0.25):
        redraw = live.tick(view.started + now, redraw, never)
    assert snapshots == []  # the thread's first ticks made none
    assert out.getvalue() == ""
    view.started -= view.interval  # the view's own clock says its first line is due
    live.tick(view.started + 2 * view.interval, redraw, never)
    assert snapshots == [1]
    assert out.getvalue().startswith("[%%train test] ")  # and it printed its line


def test_a_widget_or_no_view_redraws_as_before() -> None:
    session = TrainSession(TrainOptions(), {"model": torch.nn.Linear(2, 2)})
    live = LiveDisplay(session, "off", "%%train test")
    assert live.view is None
    assert live.first_redraw().interval == float("inf")
    widget = LiveDisplay(session, "widget", "%%train test")
    assert isinstance(widget.view, WidgetView)
    redraw = widget.first_redraw()
    assert redraw.interval == widget.view.interval
    assert redraw.ready(0.0)  # its first tick draws


def test_the_status_file_holds_every_progress_field(tmp_path: Path) -> None:
    session = TrainSession(TrainOptions(), {"model": torch.nn.Linear(2, 2)})
    writer = StatusWriter(session.progress, notebook="nb.ipynb", run_name="r", directory=tmp_path)
    writer.start()
    written = json.loads(writer.path.read_text())
    progress = asdict(session.progress())
    progress.pop("wall_s"), written.pop("wall_s")  # the one field that moves between the reads
    assert {k: written[k] for k in progress} == progress
    assert written["run_name"] == "r"
    assert written["notebook"] == "nb.ipynb"
    assert set(written) == set(progress) | {
        "pid", "pid_started", "notebook", "run_name", "started", "notify_after", "cell_id",
        "updated",
    }  # fmt: skip


@pytest.mark.parametrize(("cpu_max", "cap"), [("150000 100000", 1), ("max 100000", None)])
def test_a_host_sample_counts_the_cpus_the_quota_allows(
    tmp_path: Path, cpu_max: str, cap: int | None
) -> None:
    (tmp_path / "cpu.max").write_text(cpu_max)
    (tmp_path / "cpu.stat").write_text("usage_usec 1000\n")
    host = HostSource(tmp_path)
    expected = usable_cpus(tmp_path)
    assert host.sample().cpus == expected
    if cap is not None:
        assert expected == cap


def test_an_optimizer_step_outside_the_rewrite_is_counted_until_the_run_closes() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session = TrainSession(TrainOptions(), {"model": model, "opt": opt})
    session.start()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()  # a library's own step: only the hook sees it
    opt.step()
    assert session.stepping.counts[id(opt)] == 2
    assert session._signals.count == 2
    assert session.checkpoints.updated
    summary = session.close("finished")
    assert summary.optimizer_steps == 2
    opt.step()  # the hook is gone with the run
    assert session.stepping.counts[id(opt)] == 2
