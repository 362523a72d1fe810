"""
`%%train --sweep N --parallel K`: K trials at a time, in K worker processes sharing the study.

`driver.run_sweep` makes or resumes the study and hands it to `run_parallel` (which the magic
gives it: the driver imports nothing of this module). The notebook process makes one payload of the cell and the notebook state it reads
(`workers.payload`: a variable that cannot be sent is refused in one line before any process
starts) and spawns K workers (`multiprocessing`'s spawn context). Each worker loads the payload
once and follows Optuna's pattern for parallel workers: it opens the same study in the same
`runs/optuna.journal` (the journal's file backend locks each write, so several processes on one
machine can share it) and asks, runs and tells trials in a loop, its sampler deciding each trial
from every trial the journal holds (TPE with `constant_liar`, so that the trials other workers
are running count as bad guesses instead of being suggested again). A trial is the same
`%%train` run as in a one-process sweep (`driver._Trial`: reports, pruning, failures, the run
record with its `"sweep"` key, per-trial checkpoints), with its display off.

- How many trials: the parent counts them out (a shared counter; each worker's first trial is
  its own, so all K start); `--timeout` and `--max-failures` (failures in a row over all the
  workers) stop every worker before its next trial.
- Devices: one GPU per worker where torch sees GPUs (`CUDA_VISIBLE_DEVICES`, round robin when
  K is more than the GPUs); on a CPU machine each worker gets `cpus // K` threads.
- The notebook shows the study as it goes, read from the journal every half second
  (`view.SweepView`), and at the end `last_sweep()` holds every trial. The notebook's own
  objects are not trained: each worker trains its own copy (with `--checkpoint`, the best
  trial's checkpoint is in the summary).
- Ctrl-C in the notebook (or an interrupted kernel) stops the workers: each marks its trial
  FAILED (interrupted), and a trial left RUNNING by a worker that had to be killed is marked
  FAILED by the storage's dead-process rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import multiprocessing.connection
import os
import queue
import random
import shutil
import signal
import tempfile
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from ..errors import NanDetected, TrainmateError
from ..runtime.notebook import notebook_path
from ..runtime.options import TrainOptions
from ..workers.payload import Payload, build, load
from . import storage as store
from .driver import (
    _fail,
    _tell,
    _Trial,
    _trial_options,
    make_pruner,
    make_sampler,
    trial_name,
    without_sweep,
)
from .space import Snapshot, parse_space
from .suggest import cell_params, set_current
from .summary import SweepSummary, importances, remember_last_sweep, summarise
from .view import SweepView

if TYPE_CHECKING:
    import optuna

WHAT = "--parallel"
POLL = 0.5  # seconds between two reads of the journal for the table
STOP_WAIT = 30.0  # seconds a stopped worker has to mark its trial before it is killed


@dataclasses.dataclass(frozen=True)
class Job:
    """What one worker is told besides the payload."""

    options: TrainOptions
    journal: str
    study: str
    notebook: str | None
    todo: int  # trials of this sweep, all workers together
    index: int
    gpu: str | None  # this worker's CUDA_VISIBLE_DEVICES, None on a CPU machine
    threads: int | None  # torch's CPU threads, on a CPU machine
    deadline: float | None  # time.time() after which no trial starts (--timeout)
    seed: int | None  # this worker's sampler seed (see `worker_seed`)


@dataclasses.dataclass(frozen=True)
class Shared:
    """What the workers share with the parent: the trials counted out, the failures in a row,
    the stop flag and the messages to the parent (`("stopped" | "fatal", reason)`)."""

    claimed: Any  # multiprocessing Value("i")
    failures: Any  # multiprocessing Value("i")
    stop: Any  # multiprocessing Event
    messages: Any  # multiprocessing Queue


def worker_devices(workers: int) -> tuple[list[str | None], int | None]:
    """Each worker's `CUDA_VISIBLE_DEVICES` (one GPU each, round robin; None without GPUs),
    and the CPU threads of each worker on a CPU machine (None with GPUs)."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return [None] * workers, max(1, (cpus or 1) // workers)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    ids = ids[:count] or [str(i) for i in range(count)]
    return [ids[i % len(ids)] for i in range(workers)], None


def worker_seed(options: TrainOptions, index: int, grid_seed: int) -> int | None:
    """A worker's sampler seed. Workers with one seed would suggest the same values: worker i
    gets `--seed` + i (none without `--seed`). The grid sampler is the other way round: it
    gives trial n the n-th point of the grid, shuffled by the seed, so every worker needs the
    same one (the parent draws it without `--seed`)."""
    if options.sampler == "grid":
        return grid_seed
    return None if options.seed is None else options.seed + index


def run_parallel(
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    study: optuna.Study,
    journal: Path,
    todo: int,
) -> SweepSummary:
    """Run `todo` trials of `study` in `--parallel` worker processes (see the module); returns
    (and keeps for `last_sweep()`) the study's summary. Re-raises Ctrl-C after stopping the
    workers and showing the study so far; raises `TrainmateError` for bad input."""
    import optuna

    assert options.monitor is not None
    monitor = options.monitor
    from optuna.storages import JournalStorage

    storage = study._storage
    assert isinstance(storage, JournalStorage)  # store.open_storage's
    try:
        payload = build(source, filename, namespace, WHAT)
    except TrainmateError:
        if not options.resume and not study.get_trials(deepcopy=False):
            optuna.delete_study(study_name=study.study_name, storage=storage)  # made for nothing
        raise
    workers = max(0, min(options.parallel, todo))
    view = SweepView(options.display, f"%%train --sweep {study.study_name} --parallel {workers}")
    shown = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}

    def refresh() -> None:
        summary = summarise(study, monitor)
        view.update(summary)
        for trial in summary.trials:
            if trial.state not in ("running", "waiting") and trial.number not in shown:
                shown.add(trial.number)
                view.trial_done(trial)

    ctx = multiprocessing.get_context("spawn")
    shared = Shared(ctx.Value("i", workers), ctx.Value("i", 0), ctx.Event(), ctx.Queue())
    gpus, threads = worker_devices(workers) if workers else ([], None)
    deadline = time.time() + options.timeout if options.timeout is not None else None
    grid_seed = options.seed if options.seed is not None else random.randrange(2**31)
    folder = Path(tempfile.mkdtemp(prefix="trainmate-sweep-"))
    processes: list[multiprocessing.process.BaseProcess] = []
    fatal: str | None = None
    stopped: str | None = None
    try:
        path = folder / "payload.pkl"
        path.write_bytes(payload.dumps())
        for index in range(workers):
            job = Job(
                options=options,
                journal=str(journal),
                study=study.study_name,
                notebook=notebook_path(namespace),
                todo=todo,
                index=index,
                gpu=gpus[index],
                threads=threads,
                deadline=deadline,
                seed=worker_seed(options, index, grid_seed),
            )
            # not daemonic: a trial's DataLoader may start worker processes of its own
            process = ctx.Process(
                target=worker_main, args=(str(path), job, shared), name=f"trainmate-sweep-{index}"
            )
            process.start()
            processes.append(process)
        while True:
            alive = [p for p in processes if p.is_alive()]
            for kind, reason in _messages(shared.messages):
                if kind == "fatal" and fatal is None:
                    fatal = reason
                    shared.stop.set()  # bad input: every trial would fail the same way
                elif kind == "stopped" and stopped is None:
                    stopped = reason
            refresh()
            if not alive:
                break
            multiprocessing.connection.wait([p.sentinel for p in alive], timeout=POLL)
    except KeyboardInterrupt:
        _stop(processes)
        store.fail_dead_trials(study, storage)
        summary = summarise(study, monitor, stopped="interrupted (Ctrl-C)")
        remember_last_sweep(summary)
        view.finish(summary)
        raise
    finally:
        _stop(processes)
        shutil.rmtree(folder, ignore_errors=True)
    store.fail_dead_trials(study, storage)  # a worker that crashed mid-trial
    crashed = [f"worker {i}" for i, p in enumerate(processes) if p.exitcode not in (0, None)]
    if crashed and stopped is None and fatal is None:
        stopped = f"{', '.join(crashed)} ended with an error (its trial marked failed)"
    if fatal is not None:
        remember_last_sweep(summarise(study, monitor, stopped=fatal))
        raise TrainmateError(fatal)
    summary = summarise(study, monitor, importances=importances(study), stopped=stopped)
    remember_last_sweep(summary)
    view.finish(summary)
    return summary


def _messages(messages: Any) -> list[tuple[str, str]]:
    found = []
    while True:
        try:
            found.append(messages.get_nowait())
        except queue.Empty:
            return found
        except (EOFError, OSError):  # a worker killed while it wrote
            return found


def _stop(processes: list[multiprocessing.process.BaseProcess]) -> None:
    """Stop the workers still running: SIGTERM (each marks its trial and leaves), then kill."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    until = time.monotonic() + STOP_WAIT
    for process in processes:
        process.join(max(0.0, until - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


# -- the worker's side ---------------------------------------------------------------------------


class _Signals:
    """SIGINT and SIGTERM in a worker: inside a trial's run they raise KeyboardInterrupt (the run
    ends as on Ctrl-C and the trial is marked); elsewhere (telling the journal) the worker leaves
    before its next trial. Only the first signal counts."""

    in_run = False
    interrupted = False

    @classmethod
    def handle(cls, signum: int, frame: types.FrameType | None) -> None:
        if cls.interrupted:
            return
        cls.interrupted = True
        if cls.in_run:
            raise KeyboardInterrupt


def worker_main(payload_path: str, job: Job, shared: Shared) -> None:
    """A worker's entrypoint (module level: the spawned process imports it by name)."""
    if job.gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = job.gpu  # before anything initialises CUDA
    signal.signal(signal.SIGINT, _Signals.handle)
    signal.signal(signal.SIGTERM, _Signals.handle)
    try:
        import torch

        if job.threads is not None:
            torch.set_num_threads(job.threads)
        payload: Payload = cloudpickle.loads(Path(payload_path).read_bytes())
        _Worker(payload, job, shared).run()
    except KeyboardInterrupt:
        return
    except Exception as exc:
        reason = f"--parallel worker {job.index}: {type(exc).__name__}: {exc}".splitlines()[0]
        shared.messages.put(("fatal", reason))
        raise SystemExit(1) from None


def _parent_alive() -> bool:
    """Whether the notebook process is still there (a killed kernel leaves no orphans
    starting trials)."""
    parent = multiprocessing.parent_process()
    return parent is None or parent.is_alive()


class _Worker:
    def __init__(self, payload: Payload, job: Job, shared: Shared) -> None:
        import optuna

        from ..runner import rewrite_for

        self.payload, self.job, self.shared = payload, job, shared
        self.options = dataclasses.replace(job.options, parallel=1)
        self.namespace = load(payload)
        if job.notebook is not None:  # run records beside the notebook
            self.namespace.setdefault("__session__", job.notebook)
        self.result = rewrite_for(payload.source, self.namespace, self.options)
        options = self.options
        self.trial_base = dataclasses.replace(without_sweep(options), display="off")
        self.space = parse_space(options.space) if options.space is not None else None
        self.snapshot = Snapshot.take(self.namespace) if self.space is not None else None
        grid = None
        if options.sampler == "grid":
            grid = self.space if self.space is not None else cell_params(payload.source)
        seed = job.seed
        sampler: optuna.samplers.BaseSampler
        if options.sampler == "tpe":
            sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        else:
            sampler = make_sampler(dataclasses.replace(options, seed=seed), grid)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.load_study(
            study_name=job.study,
            storage=store.open_storage(Path(job.journal)),
            sampler=sampler,
            pruner=make_pruner(options.prune),
        )

    def _claim(self) -> bool:
        """One more trial for this worker, if the sweep has trials left."""
        claimed = self.shared.claimed
        with claimed.get_lock():
            if claimed.value >= self.job.todo:
                return False
            claimed.value += 1
            return True

    def _failed(self, failed: bool) -> bool:
        """Count a trial's outcome; True when `--max-failures` trials failed in a row."""
        failures = self.shared.failures
        with failures.get_lock():
            failures.value = failures.value + 1 if failed else 0
            return bool(failures.value >= self.options.max_failures)

    def _stop(self, reason: str) -> None:
        self.shared.messages.put(("stopped", reason))
        self.shared.stop.set()

    def run(self) -> None:
        first = True  # each worker's first trial is counted out by the parent
        while first or self._claim():
            first = False
            if self.shared.stop.is_set() or _Signals.interrupted or not _parent_alive():
                return
            if self.job.deadline is not None and time.time() > self.job.deadline:
                self._stop(f"--timeout {self.options.timeout:g} s reached")
                return
            if not self._trial():
                return

    def _trial(self) -> bool:
        """Ask, run and tell one trial; False when the worker should stop."""
        from ..runner import RunHooks, run_cell

        study, options = self.study, self.options
        with self.shared.claimed.get_lock():  # one ask at a time: the grid sampler then
            trial = study.ask()  # sees the points the other workers took (no duplicates)
        store.mark_process(trial)
        running = _Trial(trial, options, lambda: None)
        trial_options = _trial_options(self.trial_base, study.study_name, trial.number)
        hooks = RunHooks(
            on_session=running.attach,
            record=running.record,
            quiet_end=True,
            name=trial_name(study.study_name, trial.number),
        )
        set_current(trial)
        try:
            _Signals.in_run = True
            if _Signals.interrupted:
                raise KeyboardInterrupt
            deferred: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
            if self.snapshot is not None and self.space is not None:
                self.snapshot.restore(self.namespace)
                values = {p.name: p.suggest(trial) for p in self.space}
                deferred = self.snapshot.write(values, self.namespace)
            with deferred:
                run_cell(
                    self.payload.source,
                    self.payload.filename,
                    trial_options,
                    self.namespace,
                    self.result,
                    hooks,
                )
        except KeyboardInterrupt:
            _Signals.in_run = False
            _fail(study, trial, running, "interrupted (Ctrl-C)")
            return False
        except Exception as exc:
            _Signals.in_run = False
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            _fail(study, trial, running, reason)
            if isinstance(exc, TrainmateError) and not isinstance(exc, NanDetected):
                # bad input (a bad suggest()): the notebook raises it, as a one-process sweep does
                self.shared.messages.put(("fatal", (str(exc).strip() or reason).splitlines()[0]))
                self.shared.stop.set()
                return False
            if self._failed(True):
                self._stop(self._too_many())
                return False
            return True
        finally:
            _Signals.in_run = False
            set_current(None)
        _tell(study, trial, running)
        if self._failed(running.pruned is None and math.isnan(running.best)):
            self._stop(self._too_many())
            return False
        return not _Signals.interrupted

    def _too_many(self) -> str:
        count = self.options.max_failures
        return f"{count} trials failed in a row (--max-failures {count})"
