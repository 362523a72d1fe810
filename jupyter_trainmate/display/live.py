"""
The live display of a `%%train` run: a thread that, a few times a second, reads the session's
progress and the sampler's latest device reading into the `RunState` and redraws the view.

Nothing runs on the training thread: the loop pays for none of this (see BENCHMARKS.md). A failure
of the thread (a reading, the status file, TensorBoard, drawing) never stops the training: it is
reported once, as an event of the run (the widget, the text view, the summary and the run record
show it), and a view that fails to draw gives way to the text view (a text view that fails, to the
summary line alone).
"""

from __future__ import annotations

import _thread
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Literal

import torch

from ..monitor.host import shared_host
from ..monitor.nvml import shared_nvml
from ..monitor.sampler import Sampler
from ..runtime.summary import RunSummary
from .advice import Advice, Measurements, advise
from .state import GiB, RunState, Snapshot
from .views import TextView, View, WidgetView, widgets_available

if TYPE_CHECKING:
    from ..runtime.session import TrainSession
    from ..runtime.status import StatusWriter
    from ..runtime.tensorboard import TensorBoardLog

DisplayMode = Literal["auto", "widget", "text", "off"]
REFRESH_S = 0.25
SAMPLE_S = 1.0


class Throttle:
    """Lets an update through at most once per `interval` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = float("-inf")

    def ready(self, now: float) -> bool:
        if now - self._last >= self.interval:
            self._last = now
            return True
        return False


class LiveDisplay:
    def __init__(
        self,
        session: TrainSession,
        mode: str = "auto",
        title: str = "%%train",
        item_lines: tuple[int, ...] = (),
        status: StatusWriter | None = None,
        tensorboard: TensorBoardLog | None = None,
    ) -> None:
        self.session = session
        self.status = status
        self.tensorboard = tensorboard
        self.state = RunState()
        self.item_lines = item_lines
        self.title = title
        self.finish_failure: str | None = None  # a failure of the final drawing (after the summary)
        self._reported: set[str] = set()
        self._text_failed = False
        self.sampler = Sampler(shared_nvml())
        if mode == "auto":
            mode = "widget" if widgets_available() else "text"
        self.view: View | None = None
        if mode == "widget":
            self.view = WidgetView(title)
        elif mode == "text":
            self.view = TextView(title)
        self._stop = threading.Event()
        self._life = _thread.allocate_lock()  # held by the thread while it runs (see `start`)
        # The status file and the TensorBoard reading, once a second counted from the run's
        # start (`_loop` primes it), not at the first tick: a run that ends within a second
        # writes neither (the first tick's CPU: 1.17 -> 0.33 ms, BENCHMARKS.md round 6; the
        # device reading, which the final drawing shows, stays at the first tick). A `%%train`
        # run's status file is first written here, at its first second (`start_later`).
        self.writes = Throttle(SAMPLE_S)
        session.on_log.append(self._on_log)
        session.on_event.append(self.state.event)
        session.on_epoch_end.append(self._epoch_ended)

    def start(self) -> None:
        # One thread per run does it all (each thread costs a run about a millisecond to start
        # and stop): the state a few times a second, NVML/host readings and the status file
        # once a second, the view when its throttle allows.
        # Started with `_thread`: `threading.Thread.start()` waits until the new thread runs,
        # which on a loaded machine is the scheduler's wait (0.15 ms median here, milliseconds
        # in bursts), paid by every run. `halt()` does not wait for a thread that has not begun
        # either: when it begins it sees the stop and ends without doing anything.
        _thread.start_new_thread(self._main, ())

    def _main(self) -> None:
        with self._life:
            if not self._stop.is_set():
                self._loop()

    def _epoch_ended(self) -> None:
        # A reading at each epoch's end (one loss read per epoch; the thread reads it 4 times a
        # second): the curve of a run shorter than REFRESH_S is not its last point alone.
        try:
            self._refresh()
        except Exception as exc:  # never raised into the training loop (this runs in `finally`)
            self._report("reading the run", exc)

    def _on_log(self, step: int, values: dict[str, float]) -> None:
        self.state.log(step, values)

    def measurements(self) -> Measurements:
        s = self.session
        progress = self.state.progress
        gpu_util = self.state.gpu_util.ys
        device = self.state.device
        total_gib = None
        if device is not None and device.gpu.available and device.gpu.gpus:
            total_gib = device.gpu.gpus[0].memory_total_bytes / GiB
        return Measurements(
            device_type=s.device.type,
            steps=progress.steps if progress else 0,
            data_wait_share=progress.data_wait_share if progress else 0.0,
            gpu_util_pct=sum(gpu_util) / len(gpu_util) if gpu_util else None,
            gpu_memory_used_fraction=self.state.gpu_memory_fraction,
            gpu_memory_total_gib=total_gib,
            bf16_capable=s.device.type == "cuda" and torch.cuda.is_bf16_supported(),
            amp=s.amp.mode,
            skipped_steps=s.skipped_steps,
            optimizer_steps=progress.optimizer_steps if progress else 0,
            cpus=shared_host().cpus(),  # the quota read once a process (about 0.2 ms a read)
            loader=s.loader_info,
            prefetch=s.prefetch_mode,
            prefetch_note=s.prefetch_note,
            item_lines=self.item_lines,
        )

    def snapshot(self, summary: RunSummary | None = None) -> Snapshot:
        s = self.session
        scale = None
        if s.scaler is not None:
            with contextlib.suppress(Exception):
                scale = float(s.scaler.get_scale())
        advice: tuple[Advice, ...] = tuple(advise(self.measurements()))
        return self.state.snapshot(
            amp=s.amp.mode,
            loss_scale=scale,
            skipped_steps=s.skipped_steps,
            advice=advice,
            summary=summary,
        )

    def _refresh(self) -> None:
        self.state.observe(self.session.progress(), self.sampler.latest)

    def _loop(self) -> None:
        # The state is refreshed at REFRESH_S (that is the loss curve's sampling rate); the view
        # redraws only when its throttle lets it (a few times a second, or every 10 s as text).
        redraw = self.first_redraw()
        sample = Throttle(SAMPLE_S)
        self.writes.ready(time.monotonic())
        while not self._stop.wait(REFRESH_S):
            redraw = self.tick(time.monotonic(), redraw, sample)

    def first_redraw(self) -> Throttle:
        """The view's redraw throttle at the thread's start. The text view prints nothing before
        its first interval, so no snapshot (the advice, the measurements) is made until then: a
        run shorter than that made one on the display thread for nothing."""
        view = self.view
        redraw = Throttle(view.interval if view is not None else float("inf"))
        if isinstance(view, TextView):
            redraw.ready(view.started)
        return redraw

    def tick(self, now: float, redraw: Throttle, sample: Throttle) -> Throttle:
        """One turn of the display thread; returns the redraw throttle (a new one after the view
        gave way to another)."""
        try:
            if sample.ready(now):
                self.sampler.sample_once()
            written = self.writes.ready(now)
            if written and self.status is not None and self.status.active:
                self.status.write()
            self._refresh()
            if written and self.tensorboard is not None:
                self.tensorboard.progress(self.state.progress)
        except Exception as exc:  # reported once; the training goes on
            self._report("reading the run", exc)
        view = self.view
        if view is not None and redraw.ready(now):
            try:
                view.update(self.snapshot())
            except Exception as exc:
                self._give_way(view, exc)
                return Throttle(self.view.interval if self.view is not None else float("inf"))
        return redraw

    def _report(self, what: str, exc: Exception, then: str = "") -> str:
        message = f"display: {what} failed ({type(exc).__name__}: {exc}){then}"
        if what not in self._reported:
            self._reported.add(what)
            self.session.event(message)  # the summary, the run record and this display
        return message

    def _give_way(self, view: View, exc: Exception) -> None:
        """A view that failed to draw: the text view takes over (after the text view, none)."""
        if isinstance(view, TextView):
            self.view = None
            self._text_failed = True
            self._report("drawing", exc, "; the summary line is shown at the end")
            return
        self.view = TextView(self.title)
        message = self._report("drawing", exc, "; the text view takes over")
        if isinstance(view, WidgetView):
            with contextlib.suppress(Exception):  # reported above; the widget may be gone
                view.note(message)

    def halt(self) -> None:
        """Stop the thread (before the status file is removed, so it cannot write it again)."""
        self._stop.set()
        life = self._life
        if life.acquire(blocking=False) or life.acquire(timeout=5):  # not begun, or ended now
            life.release()

    def finish(self, summary: RunSummary) -> Snapshot:
        """Draw the final state (it stays in the saved notebook)."""
        self.halt()
        try:
            self._refresh()
        except Exception as exc:
            self.finish_failure = self._report("reading the run", exc)
        snap = self.snapshot(summary)
        if self.view is None:  # --display off: the summary line only
            print(summary.line(), flush=True)
            if summary.error is not None:
                print(summary.error.text(), flush=True)
            if self._text_failed:  # with the events (the failure among them) it could not show
                for event in snap.events:
                    print(f"[{self.title}] {event}", flush=True)
            return snap
        try:
            self.view.finish(snap)
        except Exception as exc:  # after the summary was made: a line of the text view
            message = (
                f"display: drawing failed ({type(exc).__name__}: {exc}); the text view takes over"
            )
            self.finish_failure = message
            self.state.event(message)
            snap = self.snapshot(summary)
            TextView(self.title).finish(snap)
        return snap
