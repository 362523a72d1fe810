"""
`%%train --procs N`: the notebook's side. The cell and the state it reads become a payload
(`workers.payload`) in a fresh folder, and torch's elastic launcher (`elastic_launch`, what
`torchrun` runs) spawns N workers (`distributed.worker`) with a c10d rendezvous on localhost.

While they train, the notebook's display reads the ranks' status files (`runtime/status.py`,
written by each worker's display thread once a second): rank 0's position, the loss averaged
over the ranks, the samples per second summed, and shows what rank 0 prints. Afterwards the
trained states go into the notebook's own model, optimizer and scheduler objects
(`load_state_dict`), and the variables the cell assigned are rebound (lists, dicts and sets it
filled are filled in place), so the next cell sees the run as after a one-process run.

A rank that fails brings the others down (the launcher stops them within a monitor interval);
the notebook shows that rank's traceback from its elastic error file. Ctrl-C reaches the
launcher as a signal: it stops the workers with SIGINT, rank 0 writes a checkpoint as a
one-process run does, and the cell ends with KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pickle
import re
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.utils.distributed import get_free_port
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ..display.live import LiveDisplay
from ..errors import TrainmateError
from ..rewrite import RewriteResult
from ..runtime.amp import AmpPolicy
from ..runtime.checkpoint import checkpoints
from ..runtime.notebook import notebook_path, runs_folder
from ..runtime.options import TrainOptions
from ..runtime.records import append_record
from ..runtime.status import STATUS_SUBDIR, StatusWriter
from ..runtime.summary import Outcome, RunProgress, RunSummary, remember_last_run
from ..workers.payload import build, reached
from ..workers.results import apply
from . import forkserver, worker

WHAT = "--procs"
_TRAINMATE_ERROR = "TrainmateError: "  # how the error file names the runtime's one-line errors
_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")


class WorkerFailed(Exception):
    """A rank failed: shows that rank's traceback (from its elastic error file) and no other."""

    def __init__(self, rank: int, world: int, message: str, traceback: str) -> None:
        super().__init__(f"--procs: rank {rank} of {world} failed: {message}")
        self.rank, self.world, self.traceback = rank, world, traceback

    def _render_traceback_(self) -> list[str]:
        head = f"%%train --procs: rank {self.rank} of {self.world} failed; the others were stopped"
        return [head, *self.traceback.rstrip().splitlines()]


def process_count(options: TrainOptions) -> int:
    if options.procs == "gpus":
        count = torch.cuda.device_count()
        if count == 0:
            raise TrainmateError("--procs gpus: torch sees no GPU")
        return count
    return int(options.procs or 1)


def backend_for(options: TrainOptions, procs: int) -> str:
    backend = options.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise TrainmateError("--backend nccl: torch sees no GPU (use --backend gloo)")
        if procs > torch.cuda.device_count():
            raise TrainmateError(
                f"--procs {procs} --backend nccl: {torch.cuda.device_count()} GPU(s) visible, "
                "one process per GPU"
            )
    return backend


def run_procs(
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    result: RewriteResult | None = None,
) -> RunSummary:
    """Run the cell data-parallel in `--procs` worker processes; the notebook's objects are
    trained afterwards. Raises `WorkerFailed`, KeyboardInterrupt, or `TrainmateError`."""
    __tracebackhide__ = True
    procs = process_count(options)
    backend = backend_for(options, procs)
    method = forkserver.start_method(backend)
    if method == "forkserver":  # it imports torch while the payload is built
        forkserver.ensure_running()
    job = worker.Job(
        options, backend, torch.initial_seed() % 2**63, environ=forkserver.worker_environ()
    )
    payload = build(source, filename, namespace, WHAT, extra={"job": job})
    if not any(_trainable(namespace[name]) for name in reached(payload.names, namespace)):
        raise TrainmateError(
            f"{WHAT} {options.procs}: the cell reads no model by name (a torch.nn.Module with "
            "trainable parameters): there is nothing to make data-parallel"
        )
    folder = Path(tempfile.mkdtemp(prefix="trainmate-procs-"))
    try:
        (folder / "payload.pkl").write_bytes(payload.dumps())
        watcher = Watcher(folder, procs, options, namespace, _title(result, procs))
        try:
            with watcher.running():
                _launch(folder, procs, method)
        except KeyboardInterrupt:
            latest = latest_checkpoint(options)
            if latest is not None:
                print(f"trainmate: interrupted; checkpoint {latest}; continue with --resume")
            raise
        summary = _summary(folder, procs, options)
        apply((folder / worker.RESULT).read_bytes(), namespace)
        remember_last_run(summary)
        watcher.finish(summary)
        return summary
    finally:
        _append_record(folder, procs)
        shutil.rmtree(folder, ignore_errors=True)


def _append_record(folder: Path, procs: int) -> None:
    """Rank 0's run record (written however the run ended, if rank 0 lived to write it) into
    the runs folder, its samples those of every rank that left a summary."""
    try:
        record = json.loads((folder / worker.RECORD).read_text())
    except (OSError, ValueError):
        return  # rank 0 was killed before its record: none, as for a killed kernel
    counts = []
    for rank in range(procs):
        with contextlib.suppress(OSError, pickle.UnpicklingError, EOFError):
            found = pickle.loads((folder / worker.summary_file(rank)).read_bytes())
            counts.append(int(found["summary"].samples))
    if len(counts) == procs:
        record["summary"]["samples"] = sum(counts)
    record.setdefault("procs", {})["samples_by_rank"] = counts if len(counts) == procs else None
    try:
        append_record(runs_folder(record.get("notebook")), record)
    except OSError as exc:  # as in one process: a read-only folder is no failed run
        print(f"trainmate: run record not written: {exc}")


def _trainable(value: object) -> bool:
    return isinstance(value, torch.nn.Module) and any(p.requires_grad for p in value.parameters())


def _title(result: RewriteResult | None, procs: int) -> str:
    if result is not None and result.batch_sources:
        return f"%%train --procs {procs}: {result.batch_sources[0]}"
    return f"%%train --procs {procs}"


def launch_config(procs: int, logs: Path, start_method: str = "spawn") -> LaunchConfig:
    """One node, `procs` workers (`forkserver.start_method`), torchrun's static rendezvous (the
    launcher's TCPStore, which the workers join) on a free localhost port, no restarts, the
    workers' output in files under `logs`.

    Static, not c10d: one node has nothing to wait for, and c10d's join sleeps a random 0-0.3 s
    and walks the whole stack with `inspect.stack()` for each of its log records (0.4 s in an
    IPython kernel, whose `sys.modules` is large)."""
    port: int = get_free_port()  # type: ignore[no-untyped-call]  # (what c10d's would use)
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=procs,
        run_id=f"trainmate-{uuid.uuid4().hex[:8]}",
        rdzv_backend="static",
        rdzv_endpoint=f"localhost:{port}",
        rdzv_configs={"rank": 0},
        max_restarts=0,
        monitor_interval=0.1,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL),
        signals_to_handle="SIGTERM,SIGINT",
    )


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[None]:
    """The launcher's own logging off, and the signal handlers it installs put back after."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


def _launch(folder: Path, procs: int, start_method: str) -> None:
    config = launch_config(procs, folder / "logs", start_method)
    with _quiet_launcher():
        try:
            elastic_launch(config, worker.main)(str(folder / "payload.pkl"), str(folder))
        except ChildFailedError as exc:
            rank, failure = exc.get_first_failure()
            rank, data = _root_cause(folder / "logs", rank, failure.error_file_data)
            message, trace = _error_file(data, str(failure.message))
            if message.startswith(_TRAINMATE_ERROR):  # a bad option for this cell: one line
                raise TrainmateError(message.removeprefix(_TRAINMATE_ERROR)) from None
            raise WorkerFailed(rank, procs, message, _from_cell(trace or message)) from None
        except SignalException as exc:
            if exc.sigval == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise


def _root_cause(logs: Path, rank: int, data: Any) -> tuple[int, Any]:
    """The rank whose error file was written first, and its contents: the launcher reports the
    first rank it finds dead, which may be one that failed only because the other had gone (a
    collective whose peer closed the connection, a few milliseconds later)."""
    written = []
    for path in logs.glob("*/attempt_*/*/error.json"):
        with contextlib.suppress(OSError, ValueError):
            written.append((path.stat().st_mtime_ns, int(path.parent.name), path))
    for _, first, path in sorted(written):
        with contextlib.suppress(OSError, ValueError):
            return first, json.loads(path.read_text())
    return rank, data


def _error_file(data: Any, fallback: str) -> tuple[str, str | None]:
    """The exception line and the traceback a rank's elastic error file holds (`record`)."""
    inner = data.get("message") if isinstance(data, dict) else None
    if isinstance(inner, str):
        return inner.strip(), None
    if isinstance(inner, dict):
        extra = inner.get("extraInfo")
        trace = extra.get("py_callstack") if isinstance(extra, dict) else None
        return str(inner.get("message", fallback)).strip(), trace
    return fallback.strip(), None


def _from_cell(trace: str) -> str:
    """A worker's traceback from the first frame of a cell on (the launcher's and the
    runtime's frames before it are noise)."""
    lines = trace.splitlines()
    starts = [
        i
        for i, line in enumerate(lines)
        if line.startswith('  File "') and not re.search(r"jupyter_trainmate|torch", line)
    ]
    if not starts or not lines or not lines[0].startswith("Traceback"):
        return trace
    return "\n".join([lines[0], *lines[starts[0] :]])


def _summary(folder: Path, procs: int, options: TrainOptions) -> RunSummary:
    """Rank 0's summary, with every rank's samples and the effective batch."""
    found = [pickle.loads((folder / worker.summary_file(r)).read_bytes()) for r in range(procs)]
    summary: RunSummary = found[0]["summary"]
    batch = found[0]["batch"]
    samples = sum(f["summary"].samples for f in found)
    accumulate = options.accumulate
    if batch:
        line = (
            f"--procs {procs}: effective batch {batch * procs * accumulate} = {batch} per rank x "
            f"{procs} ranks x {accumulate} accumulated (one process: {batch * accumulate}); "
            "the learning rate is as the cell set it"
        )
    else:
        line = f"--procs {procs}: {procs} ranks (batch size unknown: no DataLoader)"
    return dataclasses.replace(summary, samples=samples, events=(*summary.events, line))


class RemoteRun:
    """What the display reads of a session, read from the ranks' status files."""

    def __init__(self, folder: Path, procs: int, options: TrainOptions) -> None:
        self._folder = folder
        self._procs = procs
        device = "cuda" if torch.cuda.is_available() and options.backend != "gloo" else "cpu"
        self.device = torch.device(device)
        self.amp = AmpPolicy("off", device, "in the workers")
        self.scaler = None
        self.skipped_steps = 0
        self.loader_info = None
        self.prefetch_mode = "off"
        self.prefetch_note = None
        self.on_log: list[Callable[[int, dict[str, float]], None]] = []
        self.on_event: list[Callable[[str], None]] = []
        self.on_epoch_end: list[Callable[[], None]] = []  # the ranks' epochs: read at 4 Hz
        self.events: list[str] = []

    def event(self, message: str) -> None:
        self.events.append(message)
        for listener in self.on_event:
            listener(message)

    def _statuses(self) -> list[dict[str, Any]]:
        found = []
        for rank in range(self._procs):
            files = sorted((self._folder / f"rank-{rank}" / STATUS_SUBDIR).glob("*.json"))
            for path in files[-1:]:
                with contextlib.suppress(OSError, ValueError):
                    found.append(json.loads(path.read_text()))
        return found

    def progress(self) -> RunProgress:
        statuses = self._statuses()
        names = [f.name for f in dataclasses.fields(RunProgress)]
        if not statuses:
            return RunProgress(
                0,
                0,
                0,
                0,
                None,
                0,
                None,
                None,
                None,
                0.0,
                0.0,
                0.0,
                0.0,
                None,
                str(self.device),
                "off",
            )
        first: dict[str, Any] = {name: statuses[0].get(name) for name in names}
        losses = [s["last_loss"] for s in statuses if s.get("last_loss") is not None]
        first["last_loss"] = sum(losses) / len(losses) if losses else None
        first["samples"] = sum(int(s.get("samples") or 0) for s in statuses)
        first["samples_per_s"] = sum(float(s.get("samples_per_s") or 0) for s in statuses)
        return RunProgress(**first)


class Watcher:
    """The notebook's side while the workers run: the live display (and the sidebar's status
    file) from the ranks' status files, and what rank 0 prints, as it comes."""

    def __init__(
        self,
        folder: Path,
        procs: int,
        options: TrainOptions,
        namespace: dict[str, Any],
        title: str,
    ) -> None:
        self.folder = folder
        self.run = RemoteRun(folder, procs, options)
        self.status = StatusWriter(
            self.run.progress,
            notebook=notebook_path(namespace),
            run_name=title,
            notify_after=options.notify_after,
        )
        self._listed = False  # the status file was written: the run ends with an ended file
        session = cast(Any, self.run)  # the display reads a session's few public attributes
        self.display = LiveDisplay(session, options.display, title, (), self.status)
        self._stop = threading.Event()
        self._printer = threading.Thread(target=self._print_rank0, daemon=True)
        self._offset = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with contextlib.suppress(OSError):
            self.status.start()
            self._listed = True
        self.display.start()
        self._printer.start()
        ended: Outcome | None = None
        try:
            yield
        except KeyboardInterrupt:
            ended = "interrupted"
            raise
        except WorkerFailed:
            ended = "failed"
            raise
        finally:
            self._stop.set()
            self._printer.join(timeout=5)
            self._print_new()
            self.display.halt()
            self.status.stop()
            if ended is not None and self._listed:  # the lab's toast, as a one-process run's
                with contextlib.suppress(OSError):
                    self.status.finish(self._last_known(ended))

    def _last_known(self, outcome: Outcome) -> RunSummary:
        """What the ranks' last status files say, as the summary of a run that did not finish."""
        p = self.run.progress()
        return RunSummary(
            outcome=outcome,
            device=p.device,
            amp=p.amp,
            amp_reason="in the workers",
            prefetch="off",
            accumulate=1,
            steps=p.steps,
            optimizer_steps=p.optimizer_steps,
            optimizer_steps_by_optimizer=(p.optimizer_steps,),
            epochs=p.epoch,
            samples=p.samples,
            wall_s=p.wall_s,
            data_wait_s=0.0,
            compute_s=0.0,
            data_wait_share=p.data_wait_share,
            skipped_steps=0,
        )

    def finish(self, summary: RunSummary) -> None:
        self.display.finish(summary)
        if self._listed:  # the lab's toast and the webhook (the ranks' files are temporary)
            with contextlib.suppress(OSError):
                self.status.finish(summary)

    def _rank0_stdout(self) -> Path | None:
        found = list((self.folder / "logs").glob("*/attempt_0/0/stdout.log"))
        return found[0] if found else None

    def _print_rank0(self) -> None:
        while not self._stop.wait(0.5):
            self._print_new()

    def _print_new(self) -> None:
        path = self._rank0_stdout()
        if path is None:
            return
        try:
            with path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        if not end:
            return
        self._offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            if not _SUMMARY_LINE.match(line):  # the notebook's display shows the summary
                print(line, flush=True)


_SUMMARY_LINE = re.compile(r"^trainmate: (finished|interrupted|failed|stopped early) after ")


def latest_checkpoint(options: TrainOptions) -> str | None:
    """The newest checkpoint of an interrupted run, for the message after Ctrl-C."""
    if options.checkpoint is None:
        return None
    found = checkpoints(Path(options.checkpoint))
    return str(found[-1]) if found else None
