"""
Webhook notifications: when a `%%train` run ends after running long enough, the server POSTs a
JSON message to `TRAINMATE_NOTIFY_URL` (or `c.TrainmateNotify.url`), for when no browser is open.

The end of a run is seen in the status files the server already lists (`server/runs.py`): a
periodic callback on the server's event loop remembers the runs it saw in progress; one that is
gone has ended. Its outcome, duration and final metrics come from the file the kernel leaves in
`trainmate-ended/` (beside the status files) when it writes one, else from the run record it
appends just after removing the status file (`runs/runs.jsonl` beside the notebook), waited for
a few seconds; without either (the kernel died) the message says so. A run never seen in
progress (shorter than the interval, or than its first second: a `%%train` run writes its
status file from then on) is found by its ended record alone. The body suits both Slack
incoming webhooks (`text`) and ntfy's JSON publishing (`topic`, `title`, `message`, `tags`,
`priority`; give ntfy's root URL and `TRAINMATE_NOTIFY_TOPIC`). Delivery runs on the event loop
with tornado's `AsyncHTTPClient`: it never blocks the server or a kernel, and is retried with
exponential backoff (`attempts`, `backoff_s`), each failure logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Int, Unicode
from traitlets.config import Configurable

from ..runtime.records import read_records
from ..runtime.status import ENDED_SUBDIR
from .runs import ENDED_KEEP_S, list_ended, list_runs

URL_ENV = "TRAINMATE_NOTIFY_URL"
TOPIC_ENV = "TRAINMATE_NOTIFY_TOPIC"
TAGS = {"finished": "white_check_mark", "stopped early": "stop_sign", "failed": "x",
        "interrupted": "warning"}  # fmt: skip


class TrainmateNotify(Configurable):
    """Server settings of the webhook (`c.TrainmateNotify.url = ...` in jupyter_server_config)."""

    url = Unicode(
        "", help=f"Webhook URL for ended runs; the {URL_ENV} environment variable wins"
    ).tag(config=True)
    topic = Unicode("", help=f"ntfy topic sent in the body ({TOPIC_ENV} wins); empty: none").tag(
        config=True
    )
    threshold_s = Float(
        60.0, help="notify only for runs longer than this (a run's own notify_after wins)"
    ).tag(config=True)
    interval_s = Float(2.0, help="how often the status files are read").tag(config=True)
    attempts = Int(5, help="deliveries tried before giving up").tag(config=True)
    backoff_s = Float(1.0, help="wait before the 2nd attempt; doubled each time").tag(config=True)
    record_wait_s = Float(
        10.0, help="how long to wait for the run record after the status file went"
    ).tag(config=True)


@dataclass
class _Ended:
    status: dict[str, Any]
    since: float  # monotonic time the run was first missed


def _record_time(record: dict[str, Any]) -> float | None:
    try:
        return datetime.strptime(str(record.get("time")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def find_record(status: dict[str, Any]) -> dict[str, Any] | None:
    """The run record of the run `status` described: the last one of its notebook written after
    the run started (records keep whole seconds)."""
    notebook = status.get("notebook")
    if not notebook:
        return None
    started = float(status.get("started") or 0.0)
    for record in reversed(read_records(Path(notebook).parent / "runs")):
        at = _record_time(record)
        if record.get("notebook") == notebook and at is not None and at >= int(started) - 1:
            found: dict[str, Any] = record
            return found
    return None


def _run_id(status: dict[str, Any]) -> str:
    """A run's name in `trainmate-ended/` (without `.json`), from its status or ended record."""
    return f"{int(status['pid'])}-{int(float(status['started']) * 1000)}"


def _ended_file(status: dict[str, Any], status_dir: Path) -> dict[str, Any] | None:
    """The ended run's own file, shaped like a run record (outcome, summary.wall_s, metrics)."""
    try:
        path = status_dir.parent / ENDED_SUBDIR / f"{_run_id(status)}.json"
        return _shaped(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _shaped(ended: dict[str, Any]) -> dict[str, Any]:
    """An ended record shaped like a run record (raises KeyError without an outcome)."""
    outcome = str(ended["outcome"])
    metrics = ended.get("metrics")
    return {
        "outcome": outcome,
        "summary": {"wall_s": ended.get("wall_s")},
        "metrics": metrics if isinstance(metrics, dict) else {},
        "restarted": ended.get("restarted") is True,  # --retries goes on: no message
        "quiet": ended.get("quiet") is True,  # a sweep's trial: the sweep's end is posted
        "run_name": ended.get("run_name"),  # a sweep's, at its end: "sweep S: N trial(s)"
    }


def find_end(status: dict[str, Any], status_dir: Path) -> dict[str, Any] | None:
    """How the run of `status` ended: its ended file, else its run record (None: not yet)."""
    return _ended_file(status, status_dir) or find_record(status)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m:02d} min" if hours else f"{m} min {s:02d} s"


def message(
    status: dict[str, Any], record: dict[str, Any] | None, topic: str = ""
) -> dict[str, Any]:
    """The JSON body: Slack's `text`, ntfy's `title`/`message`/`tags`, and the facts as fields."""
    notebook = str(status.get("notebook") or "a notebook")
    name = Path(notebook).name
    summary = (record or {}).get("summary") or {}
    outcome = str(record["outcome"]) if record else "ended (no run record: the kernel stopped?)"
    wall = float(summary.get("wall_s") or status.get("wall_s") or 0.0)
    metrics = {str(k): v for k, v in sorted(((record or {}).get("metrics") or {}).items())}
    shown = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, int | float) else f"{k}={v}" for k, v in metrics.items()
    )
    title = f"{name}: {outcome}"
    run_name = (record or {}).get("run_name") or status.get("run_name") or ""
    text = f"%%train {run_name} {outcome} after {_duration(wall)}".replace("  ", " ") + (
        f"; {shown}" if shown else ""
    )
    body: dict[str, Any] = {
        "text": f"{title}. {text}",
        "title": title,
        "message": text,
        "tags": [TAGS.get(outcome, "grey_question"), "trainmate"],
        "priority": 3 if outcome == "finished" else 4,
        "notebook": notebook,
        "run_name": run_name or None,
        "outcome": outcome,
        "duration_s": round(wall, 1),
        "metrics": metrics,
    }
    if topic:
        body["topic"] = topic
    return body


class Notifier:
    """Watches the status files and the ended records; posts once per ended run that ran long
    enough.

    A run seen in progress (its status file) that is gone has ended: its ended record, else its
    run record, says how. A run never seen in progress, because it was shorter than the interval
    or than its first second (a `%%train` run writes its status file from its first second on),
    is found by its ended record alone, once, if it ended after the notifier started."""

    def __init__(self, settings: TrainmateNotify, status_dir: Path, log: logging.Logger) -> None:
        self.settings = settings
        self.url = os.environ.get(URL_ENV) or settings.url
        self.topic = os.environ.get(TOPIC_ENV) or settings.topic
        self.status_dir = status_dir
        self.log = log
        self.running: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, _Ended] = {}
        self.handled: dict[str, float] = {}  # run id -> when it ended: posted or passed over
        self.since = time.time()  # ended records before this are the past
        self.delivered = 0  # messages a webhook accepted (tests, logs)
        self._busy = False
        self._tasks: set[asyncio.Task[bool]] = set()
        self._callback: PeriodicCallback | None = None

    def start(self) -> None:
        if not self.url:
            return
        self._callback = PeriodicCallback(self._tick, self.settings.interval_s * 1000)
        self._callback.start()
        self.log.info("jupyter_trainmate: notifying %s of ended runs", self.url)

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()

    async def _tick(self) -> None:
        if self._busy:  # a slow file system: never two reads at once
            return
        self._busy = True
        try:
            runs = await asyncio.to_thread(list_runs, self.status_dir)
            await self.check(runs)
            ended = await asyncio.to_thread(list_ended, self.status_dir)
            self.check_ended(ended)
        except Exception:
            self.log.exception("jupyter_trainmate: reading run status failed")
        finally:
            self._busy = False

    async def check(self, runs: list[dict[str, Any]]) -> None:
        """One look at the runs in progress: remember them, and post for those that ended."""
        now = {f"{r.get('pid')}-{r.get('started')}": r for r in runs}
        for key in self.running.keys() - now.keys():
            self.ended[key] = _Ended(self.running[key], time.monotonic())
        self.running = now
        for key, ended in list(self.ended.items()):
            record = await asyncio.to_thread(find_end, ended.status, self.status_dir)
            waited = time.monotonic() - ended.since
            if record is None and waited < self.settings.record_wait_s:
                continue  # the kernel writes the record just after removing the status file
            del self.ended[key]
            with contextlib.suppress(KeyError, ValueError, TypeError):
                self.handled[_run_id(ended.status)] = time.time()
            self._conclude(ended.status, record)

    def check_ended(self, records: list[dict[str, Any]]) -> None:
        """The ended records: post for the runs that ended since the notifier started and were
        not seen in progress (those are `check`'s)."""
        waiting = set()
        for e in self.ended.values():
            with contextlib.suppress(KeyError, ValueError, TypeError):
                waiting.add(_run_id(e.status))
        running = set()
        for r in self.running.values():
            with contextlib.suppress(KeyError, ValueError, TypeError):
                running.add(_run_id(r))
        for ended in records:
            try:
                run_id, at = _run_id(ended), float(ended["ended"])
                shaped = _shaped(ended)
            except (KeyError, ValueError, TypeError):
                continue
            if at < self.since or run_id in self.handled or run_id in waiting | running:
                continue
            self.handled[run_id] = at
            self._conclude(ended, shaped)
        for run_id, at in list(self.handled.items()):  # the records are kept ENDED_KEEP_S
            if time.time() - at > 2 * ENDED_KEEP_S:
                del self.handled[run_id]

    def _conclude(self, status: dict[str, Any], record: dict[str, Any] | None) -> None:
        if record is not None and (record.get("restarted") or record.get("quiet")):
            return  # an attempt that --retries restarted, a sweep's trial: it goes on
        if self._long_enough(status, record):
            task = asyncio.create_task(self.post(message(status, record, self.topic)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _long_enough(self, status: dict[str, Any], record: dict[str, Any] | None) -> bool:
        summary = (record or {}).get("summary") or {}
        wall = float(summary.get("wall_s") or status.get("wall_s") or 0.0)
        threshold = status.get("notify_after")
        if not isinstance(threshold, int | float) or isinstance(threshold, bool):
            threshold = self.settings.threshold_s
        return wall >= float(threshold)

    async def post(self, body: dict[str, Any]) -> bool:
        """Deliver `body`, retrying with exponential backoff; True once a 2xx came back."""
        client = AsyncHTTPClient()
        data = json.dumps(body, sort_keys=True)
        attempts = max(1, self.settings.attempts)
        for attempt in range(1, attempts + 1):
            request = HTTPRequest(
                self.url, method="POST", body=data, request_timeout=10.0,
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            try:
                response = await client.fetch(request, raise_error=False)
                code, reason = response.code, response.reason
            except Exception as exc:  # refused, DNS, TLS: retried like a 5xx
                code, reason = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= code < 300:
                self.delivered += 1
                return True
            self.log.warning(
                "jupyter_trainmate: webhook attempt %d/%d failed: %s %s",
                attempt, attempts, code or "", reason,
            )  # fmt: skip
            if attempt < attempts:
                await asyncio.sleep(self.settings.backoff_s * 2 ** (attempt - 1))
        self.log.error(
            "jupyter_trainmate: webhook gave up after %d attempts: %s", attempts, body["title"]
        )
        return False
