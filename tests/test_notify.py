"""The webhook: the server extension POSTs once when a long run ends, retried after a 5xx."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jupyter_trainmate.runtime.records import append_record
from jupyter_trainmate.runtime.status import StatusWriter
from jupyter_trainmate.runtime.summary import RunProgress
from jupyter_trainmate.server.handlers import MetricsState
from jupyter_trainmate.server.notify import URL_ENV, Notifier, TrainmateNotify
from jupyter_trainmate.server.runs import list_ended


@dataclass
class Hook:
    """A local webhook that answers 500 to the first `failures` POSTs, then 200."""

    url: str
    failures: int = 1
    answers: list[int] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def hook() -> Iterator[Hook]:
    found = Hook("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            code = 500 if len(found.answers) < found.failures else 200
            found.bodies.append(body)
            found.answers.append(code)
            self.send_response(code)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    found.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    yield found
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def jp_server_config(hook: Hook, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv(URL_ENV, hook.url)  # read when the extension loads
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_trainmate": True}},
        "TrainmateNotify": {
            "interval_s": 0.05,
            "backoff_s": 0.05,
            "attempts": 3,
            "threshold_s": 0.0,
        },
    }


def _progress(wall_s: float) -> RunProgress:
    return RunProgress(
        steps=240, samples=7680, optimizer_steps=240, epoch=3, epochs_total=3, step_in_epoch=80,
        steps_per_epoch=80, fraction=1.0, eta_s=0.0, wall_s=wall_s, samples_per_s=64.0,
        steps_per_s=2.0, data_wait_share=0.1, last_loss=0.2, device="cpu", amp="off",
    )  # fmt: skip


async def _until(condition: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _record(notebook: Path, outcome: str, wall_s: float) -> dict[str, Any]:
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "notebook": str(notebook),
        "outcome": outcome,
        "metrics": {"val_acc": 0.93125, "val_loss": 0.21},
        "summary": {"wall_s": wall_s, "steps": 240},
    }


async def test_an_ended_run_is_posted_once_after_a_retry(
    hook: Hook, jp_serverapp: Any, jp_root_dir: Path
) -> None:
    state: MetricsState = jp_serverapp.web_app.settings["trainmate"]
    notifier: Notifier = jp_serverapp.web_app.settings["trainmate_notifier"]
    assert notifier.url == hook.url
    notebook = jp_root_dir / "train.ipynb"
    writer = StatusWriter(lambda: _progress(125.0), notebook=str(notebook), run_name="loader",
                          directory=state.runs_dir)  # fmt: skip
    writer.start()
    await _until(lambda: len(notifier.running) == 1, "the run to be seen")
    assert hook.bodies == []  # nothing while it runs
    writer.stop()  # as the kernel does: the status file goes, then the record is written
    append_record(jp_root_dir / "runs", _record(notebook, "finished", 125.4))
    await _until(lambda: notifier.delivered == 1, "the delivery")
    await asyncio.sleep(0.3)  # several more ticks: nothing is posted twice
    assert hook.answers == [500, 200]
    assert hook.bodies[0] == hook.bodies[1]
    body = hook.bodies[1]
    assert body["title"] == "train.ipynb: finished"
    assert body["text"] == (
        "train.ipynb: finished. %%train loader finished after 2 min 05 s; "
        "val_acc=0.9313, val_loss=0.21"
    )
    assert body["message"] == body["text"].split(". ", 1)[1]
    assert body["tags"] == ["white_check_mark", "trainmate"]
    assert body["outcome"] == "finished"
    assert body["duration_s"] == 125.4
    assert body["metrics"] == {"val_acc": 0.93125, "val_loss": 0.21}
    assert body["notebook"] == str(notebook)
    assert "topic" not in body


def fit(model: Any, opt: Any, loader: Any) -> None:
    import torch
    import torch.nn.functional as F

    import jupyter_trainmate

    for _ in range(6):
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            time.sleep(0.005)  # the run lasts a few of the watcher's ticks
        with torch.no_grad():
            jupyter_trainmate.log(val_loss=F.cross_entropy(model(xb), yb))


async def test_a_real_run_in_the_servers_runtime_dir_is_posted(
    hook: Hook, jp_serverapp: Any, jp_root_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from jupyter_trainmate import train
    from jupyter_trainmate.runtime.status import status_dir

    hook.failures = 0
    state: MetricsState = jp_serverapp.web_app.settings["trainmate"]
    assert status_dir() == state.runs_dir  # the kernel (this process) and the server agree
    notebook = jp_root_dir / "real.ipynb"
    monkeypatch.setenv("JPY_SESSION_NAME", str(notebook))
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    # In a thread, as in a kernel: the server's event loop keeps watching meanwhile.
    await asyncio.to_thread(
        train, fit, "--display off --tensorboard off", model=model, opt=opt, loader=loader
    )
    notifier: Notifier = jp_serverapp.web_app.settings["trainmate_notifier"]
    await _until(lambda: notifier.delivered == 1, "the delivery")
    await asyncio.sleep(0.3)
    assert hook.answers == [200]
    body = hook.bodies[0]
    assert body["notebook"] == str(notebook)
    assert body["outcome"] == "finished"
    assert body["run_name"] == "loader"
    assert body["title"] == "real.ipynb: finished"
    assert list(body["metrics"]) == ["val_loss"]
    assert body["duration_s"] > 0


async def test_threshold_notify_after_and_a_vanished_kernel(hook: Hook, tmp_path: Path) -> None:
    hook.failures = 0
    settings = TrainmateNotify(threshold_s=60.0, record_wait_s=0.0, attempts=1, topic="runs")
    notifier = Notifier(settings, tmp_path / "status", logging.getLogger("test"))
    notifier.url = hook.url
    notebook = tmp_path / "nb.ipynb"
    short = {"pid": 1, "started": time.time(), "notebook": str(notebook), "run_name": "a",
             "wall_s": 5.0}  # fmt: skip
    marked = {**short, "pid": 2, "notify_after": 1, "run_name": "b"}
    gone = {**short, "pid": 3, "wall_s": 300.0, "notebook": str(tmp_path / "other.ipynb")}
    # A kernel that leaves an ended file (trainmate-ended/, the status file's name): it wins.
    left = {**short, "pid": 4, "notebook": None, "started": 1700000000.25}
    ended = tmp_path / "trainmate-ended" / "4-1700000000250.json"
    ended.parent.mkdir()
    ended.write_text(json.dumps({"outcome": "stopped early", "wall_s": 90.0, "metrics": {}}))
    await notifier.check([short, marked, gone, left])
    append_record(tmp_path / "runs", _record(notebook, "failed", 5.0))
    await notifier.check([])
    await _until(lambda: len(hook.bodies) == 3, "three deliveries")
    await asyncio.sleep(0.1)
    bodies = sorted(hook.bodies, key=lambda b: b["outcome"])
    assert [b["outcome"] for b in bodies] == [
        "ended (no run record: the kernel stopped?)",  # 300 s and no record of other.ipynb
        "failed",  # run b: 5 s, but its notify_after is 1 s; run a (5 s < 60 s) is not posted
        "stopped early",  # run 4's ended file: 90 s
    ]
    assert bodies[2]["duration_s"] == 90.0
    assert bodies[1]["tags"] == ["x", "trainmate"]
    assert bodies[1]["priority"] == 4
    assert all(b["topic"] == "runs" for b in bodies)
    assert bodies[2]["title"] == "a notebook: stopped early"


async def test_gives_up_after_the_attempts(
    hook: Hook, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hook.failures = 10
    settings = TrainmateNotify(attempts=3, backoff_s=0.01)
    notifier = Notifier(settings, tmp_path, logging.getLogger("test"))
    notifier.url = hook.url
    with caplog.at_level(logging.WARNING):
        assert await notifier.post({"title": "x"}) is False
    assert hook.answers == [500, 500, 500]
    assert "webhook attempt 3/3 failed: 500" in caplog.text
    assert "webhook gave up after 3 attempts: x" in caplog.text


@pytest.mark.parametrize(
    ("outcome", "flag"),
    [("failed", "restarted"), ("finished", "quiet")],
    ids=["an attempt --retries restarted", "a sweep's trial"],
)
async def test_an_end_that_is_not_the_runs_end_is_not_posted(
    tmp_path: Path, outcome: str, flag: str
) -> None:
    """`--retries`: the failed attempt's ended file says it restarted, and the run goes on (its
    real end is posted later); a trial of a sweep ends `quiet` (the sweep's own end is the one
    message). Nothing is sent for either, and nothing waits for its record."""
    settings = TrainmateNotify(threshold_s=0.0, record_wait_s=60.0, attempts=1)
    notifier = Notifier(settings, tmp_path / "status", logging.getLogger("test"))
    notifier.url = "http://127.0.0.1:9/never"
    status = {"pid": 5, "started": 1700000000.5, "notebook": None, "run_name": "a", "wall_s": 9.0}
    ended = tmp_path / "trainmate-ended" / "5-1700000000500.json"
    ended.parent.mkdir()
    ended.write_text(json.dumps({"outcome": outcome, "wall_s": 9.0, flag: True}))
    await notifier.check([status])
    await notifier.check([])
    assert not notifier.ended
    assert not notifier._tasks


async def test_a_run_never_seen_in_progress_is_posted_once_from_its_ended_record(
    hook: Hook, tmp_path: Path
) -> None:
    """A run shorter than its first second writes no status file: its ended record is how the
    notifier learns of it. Once, and only for runs that ended after the notifier started."""
    hook.failures = 0
    settings = TrainmateNotify(threshold_s=0.0, record_wait_s=0.0, attempts=1)
    status_dir = tmp_path / "trainmate-runs"
    notifier = Notifier(settings, status_dir, logging.getLogger("test"))
    notifier.url = hook.url
    folder = tmp_path / "trainmate-ended"
    folder.mkdir()

    def leave(pid: int, ended: float, **more: Any) -> dict[str, Any]:
        started = ended - 0.4
        record = {"pid": pid, "started": started, "ended": ended, "outcome": "finished",
                  "wall_s": 0.4, "metrics": {"acc": 0.5}, "notebook": str(tmp_path / "nb.ipynb"),
                  "run_name": f"run {pid}", **more}  # fmt: skip
        (folder / f"{pid}-{int(started * 1000)}.json").write_text(json.dumps(record))
        return record

    leave(1, notifier.since - 5)  # before the notifier started: the past
    leave(2, time.time())
    leave(3, time.time(), quiet=True)  # a sweep's trial
    seen = leave(4, time.time())  # seen in progress: `check`'s to post, not this one's
    await notifier.check([seen])
    await notifier.check([])  # gone: posted from its ended record by `check`
    notifier.check_ended(list_ended(status_dir))
    notifier.check_ended(list_ended(status_dir))  # a second look posts nothing again
    await _until(lambda: len(hook.bodies) == 2, "two deliveries")
    await asyncio.sleep(0.2)
    assert sorted(b["title"] for b in hook.bodies) == ["nb.ipynb: finished"] * 2
    assert sorted(b["message"] for b in hook.bodies) == [
        "%%train run 2 finished after 0 s; acc=0.5",
        "%%train run 4 finished after 0 s; acc=0.5",
    ]
