"""The ended-run records the lab's toasts are made from, written by real `%%train` runs."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_trainmate.runtime.options import parse_options
from jupyter_trainmate.runtime.status import StatusWriter, ended_dir
from jupyter_trainmate.server.handlers import MetricsState
from jupyter_trainmate.server.runs import list_ended, list_runs
from jupyter_trainmate.sweep.notice import IDLE

from .train_harness import COMMON, fresh_shell, status_writes

LOOP = """
import jupyter_trainmate
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    jupyter_trainmate.log(acc=0.5 + epoch / 4)
"""


def _ended(runtime: Path) -> list[dict[str, Any]]:
    return list_ended(runtime / "trainmate-runs")


def test_a_run_leaves_its_outcome_duration_and_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("JPY_SESSION_NAME", "/work/notebooks/train.ipynb")
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    before = time.time()
    ip.run_cell(f"%%train --display off --notify-after 5\n{LOOP}").raise_error()
    [ended] = _ended(tmp_path)
    assert ended["outcome"] == "finished"
    assert ended["notebook"] == "/work/notebooks/train.ipynb"
    assert ended["run_name"] == "loader"
    assert ended["notify_after"] == 5.0
    assert ended["cell_id"] is None  # a plain IPython shell sends no cell id
    assert ended["metrics"] == {"acc": 0.75}
    assert ended["steps"] == 16
    assert ended["epochs"] == 2
    assert ended["last_loss"] is not None
    assert 0 < ended["wall_s"] <= time.time() - before
    assert before <= ended["started"] <= ended["ended"] <= time.time()
    assert list_runs(tmp_path / "trainmate-runs") == []  # no longer in progress

    # A failing run is reported too, without --notify-after (the lab's threshold decides).
    ip.run_cell(f"%%train --display off\n{LOOP}\n    raise ValueError('bad batch')")
    ended = _ended(tmp_path)
    assert [e["outcome"] for e in ended] == ["finished", "failed"]
    assert ended[1]["notify_after"] is None
    assert ended[1]["id"] != ended[0]["id"]


def test_notify_after_is_an_option_at_the_end_of_the_table() -> None:
    assert parse_options("--notify-after 90").notify_after == 90.0
    assert parse_options("").notify_after is None


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_trainmate": True}}}


async def test_ended_endpoint_lists_recent_runs_with_their_lab_path(
    jp_fetch: Callable[..., Awaitable[Any]], jp_serverapp: Any
) -> None:
    state: MetricsState = jp_serverapp.web_app.settings["trainmate"]
    folder = ended_dir(state.runs_dir)
    folder.mkdir(parents=True)
    notebook = Path(jp_serverapp.root_dir) / "sub" / "nb.ipynb"
    record = {"id": "1-2", "notebook": str(notebook), "outcome": "failed", "ended": time.time()}
    (folder / "1-2.json").write_text(json.dumps(record))
    body = json.loads((await jp_fetch("trainmate", "api", "ended")).body)
    assert body == {"ended": [{**record, "path": "sub/nb.ipynb"}]}


def _sweep_seeing_the_sidebar(tmp_path: Path) -> list[list[str]]:
    """A 3-trial sweep whose trials each read the sidebar's runs; what each saw."""
    ip = fresh_shell()
    ip.run_cell(COMMON + "\nseen = []\n").raise_error()
    cell = (
        "import jupyter_trainmate\n"
        "lr = jupyter_trainmate.suggest('lr', 1e-3, 0.5, log=True)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
        + LOOP
        + "from pathlib import Path\nfrom jupyter_trainmate.server.runs import list_runs\n"
        + f"seen.append([r['run_name'] for r in list_runs(Path({str(tmp_path)!r}) / 'trainmate-runs')])\n"
    )
    ip.run_cell(
        f"%%train --display off --sweep 3 --monitor acc --mode max --study s --seed 1\n{cell}"
    ).raise_error()
    seen: list[list[str]] = ip.user_ns["seen"]
    return seen


def test_a_sweep_is_one_entry_in_the_sidebar_and_ends_with_one_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its trials show in the sweep's own status file (no entry, no toast of their own); the
    search's end is one ended record with the best value."""
    from jupyter_trainmate.sweep import notice

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(notice, "RENAME_S", 0.0)  # every trial's start writes its name
    assert _sweep_seeing_the_sidebar(tmp_path) == [
        ["sweep s: trial 1 of 3"], ["sweep s: trial 2 of 3"], ["sweep s: trial 3 of 3"]
    ]  # fmt: skip
    [ended] = _ended(tmp_path)
    assert ended["run_name"] == "sweep s: 3 trial(s)"
    assert ended["outcome"] == "finished"
    assert ended["epochs"] == 3
    assert ended["metrics"] == {"best acc": 0.75}
    assert ended["sweep"] == {"study": "s", "trials": 3}
    assert list_runs(tmp_path / "trainmate-runs") == []


def test_a_trials_start_writes_the_sidebar_at_most_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first trial's name is written at its start; a trial starting within `RENAME_S` of
    that write leaves its name to the next write (a display thread's, once a second), so three
    short trials show the first one's name. The sweep's end is the same one notice."""
    from jupyter_trainmate.display import live
    from jupyter_trainmate.sweep import notice

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(notice, "RENAME_S", 3600.0)
    monkeypatch.setattr(live, "SAMPLE_S", 3600.0)  # no display thread writes within a trial
    writes = status_writes(monkeypatch)
    assert _sweep_seeing_the_sidebar(tmp_path) == [["sweep s: trial 1 of 3"]] * 3
    assert writes == ["sweep s: 3 trial(s)", "sweep s: trial 1 of 3"]  # the search's start, then
    [ended] = _ended(tmp_path)
    assert ended["run_name"] == "sweep s: 3 trial(s)"
    assert list_runs(tmp_path / "trainmate-runs") == []


def test_a_parallel_sweep_is_in_the_sidebar_before_any_trial_of_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--parallel` trials run in worker processes: the sweep's own entry is written when the
    search starts, not left to a trial's start in this process."""
    from jupyter_trainmate.sweep.notice import SweepNotice

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    notice = SweepNotice("s", 4, parse_options("--sweep 4 --parallel 2 --monitor val"), None)
    assert [r["run_name"] for r in list_runs(tmp_path / "trainmate-runs")] == [
        "sweep s: 4 trial(s), 2 at a time"
    ]
    notice.end("finished", None)
    assert list_runs(tmp_path / "trainmate-runs") == []


def test_a_name_left_unwritten_is_in_the_next_write(tmp_path: Path) -> None:
    status = StatusWriter(lambda: IDLE, notebook=None, run_name="a", directory=tmp_path)
    status.start()
    status.rename("b", write=False)
    assert json.loads(status.path.read_text())["run_name"] == "a"
    status.write()  # as the display thread does once a second
    assert json.loads(status.path.read_text())["run_name"] == "b"
    status.stop()
    assert not status.path.exists()
