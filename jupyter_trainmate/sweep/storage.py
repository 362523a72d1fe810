"""
Where studies live: `runs/optuna.journal` beside the notebook, Optuna's `JournalStorage` with its
file backend (safe for several processes on one machine).

The journal has no heartbeat, so each trial carries the process that runs it (its pid and the
process's start time, as the sidebar's status files do): on `--resume`, a trial still RUNNING
whose process is gone, or whose pid now belongs to another process, is marked FAILED. The
storage `open_storage` returns writes that signature in the trial's creation record (`ask()`'s
one journal write), not in a second write of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil

if TYPE_CHECKING:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal._file import BaseJournalFileLock

JOURNAL = "optuna.journal"
PROCESS = "trainmate_process"  # {"pid": ..., "started": ...}: one journal write per trial
REASON = "trainmate_reason"
CHECKPOINT = "trainmate_checkpoint"


def open_storage(path: Path) -> JournalStorage:
    """The journal at `path`; each trial `study.ask()` creates in it is signed with this process
    in the same write (see `mark_process`)."""
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = _SignalsHeld(JournalFileSymlinkLock(str(path)))  # Optuna's default lock, shielded
    # (it has the two methods of Optuna's lock class, which the package does not export)
    backend = JournalFileBackend(str(path), lock_obj=cast("BaseJournalFileLock", lock))
    return _signing_storage()(backend)


class _SignalsHeld:
    """Optuna's journal lock with Ctrl-C and SIGTERM held back from taking it to releasing it.

    The lock is a file that `acquire` makes and `release` removes. A KeyboardInterrupt between
    the two (a Ctrl-C in the notebook, or the signal `--parallel` sends its workers, landing in a
    `trial.report` or a `tell`) skipped the removal: every process then waited for Optuna's
    30 s grace period before it could write again, and a `--parallel` worker stuck there was
    killed and its trial marked "its process ended" instead of "interrupted (Ctrl-C)" (seen
    once in a full test run). A signal that arrives meanwhile is handed to the handler it was
    meant for once the lock is released. Handlers can only be set on the main thread: another
    thread's writes are not shielded (signals interrupt only the main thread anyway)."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._saved: dict[int, Any] | None = None
        self._pending: list[tuple[int, Any]] = []

    def acquire(self) -> bool:
        self._hold()
        try:
            return bool(self._lock.acquire())
        except BaseException:
            self._let_go()
            raise

    def release(self) -> None:
        try:
            self._lock.release()
        finally:
            self._let_go()

    def _hold(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._pending = []
        saved: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            saved[signum] = signal.signal(signum, self._later)
        self._saved = saved

    def _later(self, signum: int, frame: Any) -> None:
        self._pending.append((signum, frame))

    def _let_go(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        pending, self._pending = self._pending, []
        for signum, frame in pending:
            handler = saved[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                if signum == signal.SIGINT:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signum)  # its default action, now that the lock is free


@dataclasses.dataclass
class _Kept:
    """A journal opened by `kept_storage`, and what tells its file is still the same one."""

    storage: JournalStorage
    file: tuple[int, int]  # st_dev, st_ino
    size: int  # its size when opened: a journal only grows
    first: bytes  # its first record (the first study's creation, with its writer's id)


_KEPT: dict[Path, _Kept] = {}


def _first_record(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.readline()


def kept_storage(path: Path) -> JournalStorage:
    """The journal at `path`, opened once per process and kept for the next sweep: opening it
    replays every record of every study in it (a cost that grows with the journal), while a kept
    storage reads only what was appended since (by this process or any other: Optuna's journal
    storage reads new records before each read or write). A kept storage is used again while its
    file is the same one: same device and inode, not shorter than when it was opened, the same
    first record; a journal deleted, replaced or rewritten is opened anew."""
    key = path.absolute()
    kept = _KEPT.get(key)
    if kept is not None:
        try:
            stat = key.stat()
            same = (stat.st_dev, stat.st_ino) == kept.file and stat.st_size >= kept.size
            first = _first_record(key) if same else b""
        except OSError:  # gone: a new journal
            same, first = False, b""
        if same and (first == kept.first or not kept.first):
            kept.first = first
            return kept.storage
    storage = open_storage(path)
    stat = key.stat()
    _KEPT[key] = _Kept(storage, (stat.st_dev, stat.st_ino), stat.st_size, _first_record(key))
    return storage


def forget(path: Path) -> None:
    """Open the journal at `path` anew next time: after a Ctrl-C, which may have stopped the
    kept storage between reading a record and applying it (its replay would skip that record)."""
    _KEPT.pop(path.absolute(), None)


def reset() -> None:
    """Forget the kept journals (tests)."""
    _KEPT.clear()


def _signature() -> dict[str, Any]:
    from ..monitor.host import this_process  # made once per process (reads /proc)

    me = this_process()
    return {"pid": me.pid, "started": me.create_time()}


@functools.cache
def _signing_storage() -> type[JournalStorage]:
    """`JournalStorage` whose new trials carry this process's signature from their creation:
    Optuna's own template of a trial (the path of `add_trial`) with the state RUNNING and the
    signature as a user attribute, one journal record instead of the creation and a second write
    of the attribute (each write locks, appends and fsyncs the journal)."""
    from optuna.storages import JournalStorage
    from optuna.trial import FrozenTrial, TrialState

    class SigningJournalStorage(JournalStorage):
        def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
            if template_trial is None:  # `study.ask()`: a new RUNNING trial
                template_trial = FrozenTrial(
                    number=-1,  # the storage numbers it
                    state=TrialState.RUNNING,
                    value=None,
                    datetime_start=datetime.now(timezone.utc),
                    datetime_complete=None,
                    params={},
                    distributions={},
                    user_attrs={PROCESS: _signature()},
                    system_attrs={},
                    intermediate_values={},
                    trial_id=-1,
                )
            return super().create_new_trial(study_id, template_trial)

    return SigningJournalStorage


def mark_process(trial: optuna.Trial) -> None:
    """Sign the trial with this process (pid and start time), unless it already is: a trial the
    storage of `open_storage` created is signed at its creation; one taken from the queue
    (`enqueue_trial`) is signed here."""
    if PROCESS not in trial.user_attrs:
        trial.set_user_attr(PROCESS, _signature())


def _alive(process: object) -> bool:
    if not isinstance(process, dict):
        return False
    pid, started = process.get("pid"), process.get("started")
    if not isinstance(pid, int) or not isinstance(started, int | float):
        return False
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1e-3
    except psutil.Error:  # NoSuchProcess, AccessDenied, ZombieProcess
        return False


def fail_dead_trials(study: optuna.Study, storage: JournalStorage) -> list[int]:
    """Mark FAILED each RUNNING trial whose process is gone; returns their numbers."""
    from optuna.trial import TrialState

    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _alive(trial.user_attrs.get(PROCESS)):
            continue
        trial_id = trial._trial_id
        with contextlib.suppress(RuntimeError):  # finished meanwhile by its own process
            storage.set_trial_user_attr(trial_id, REASON, "its process ended while it ran")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            failed.append(trial.number)
    return failed


def list_studies(path: Path) -> str:
    """The studies of a journal as a text table (`%trainmate sweeps`)."""
    import optuna
    from optuna.trial import TrialState

    if not path.exists():
        return f"no studies: {path} does not exist (run %%train --sweep N first)"
    storage = open_storage(path)
    rows = [("study", "trials", "complete", "pruned", "failed", "best", "direction")]
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=True):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        best = summary.best_trial
        direction = summary.direction.name.lower() if summary.direction is not None else "?"
        rows.append(
            (
                summary.study_name,
                str(len(states)),
                str(states.count(TrialState.COMPLETE)),
                str(states.count(TrialState.PRUNED)),
                str(states.count(TrialState.FAIL)),
                f"{best.value:.4g} (trial {best.number})"
                if best is not None and best.value is not None
                else "-",
                direction,
            )
        )
    if len(rows) == 1:
        return f"no studies in {path}"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
