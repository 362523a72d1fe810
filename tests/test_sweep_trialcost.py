"""What a sweep's trial pays per trial (issue 15, round 2): the trial's process signature written
in the trial's creation record, the trial options made once per sweep, the sweep's status file
at a trial's start. No timing: each test checks the behaviour the cut keeps."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import optuna
import pytest

from jupyter_trainmate.monitor.host import this_process
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.sweep.driver import _trial_options, without_sweep
from jupyter_trainmate.sweep.notice import IDLE, SweepNotice
from jupyter_trainmate.sweep.storage import (
    PROCESS,
    fail_dead_trials,
    kept_storage,
    mark_process,
    open_storage,
)
from jupyter_trainmate.sweep.summary import SweepSummary, last_sweep

from .test_sweep import SUGGEST_CELL, shell, sweep

JOURNAL = Path("runs") / "optuna.journal"


def last() -> SweepSummary:
    summary = last_sweep()
    assert summary is not None
    return summary


def _records() -> list[dict[str, object]]:
    return [json.loads(line) for line in JOURNAL.read_text().splitlines()]


def test_an_asked_trial_is_signed_in_its_one_creation_record() -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(JOURNAL))
    before = len(_records())
    trial = study.ask()
    after = _records()
    assert len(after) == before + 1  # the creation alone: no second write for the signature
    me = this_process()
    assert after[-1]["user_attrs"] == {PROCESS: {"pid": os.getpid(), "started": me.create_time()}}
    assert trial.user_attrs[PROCESS] == {"pid": os.getpid(), "started": me.create_time()}
    mark_process(trial)  # already signed: writes nothing
    assert len(_records()) == before + 1
    # what Optuna reads back from the journal (a fresh replay): a RUNNING trial, numbered, timed
    [frozen] = optuna.load_study(study_name="s", storage=open_storage(JOURNAL)).trials
    assert frozen.state == optuna.trial.TrialState.RUNNING
    assert frozen.number == 0
    assert frozen.datetime_start is not None
    assert frozen.user_attrs[PROCESS]["pid"] == os.getpid()
    study.tell(trial, 1.0)
    second = study.ask()
    assert second.number == 1
    assert fail_dead_trials(study, open_storage(JOURNAL)) == []  # its process is alive


def test_an_enqueued_trial_is_signed_when_asked() -> None:
    """A trial from the queue was created WAITING by `enqueue_trial` (with Optuna's template,
    not signed): `mark_process` signs it once it runs here."""
    study = optuna.create_study(study_name="q", storage=open_storage(JOURNAL))
    study.enqueue_trial({"x": 1.0})
    trial = study.ask()
    assert PROCESS not in trial.user_attrs
    mark_process(trial)
    assert trial.user_attrs[PROCESS]["pid"] == os.getpid()
    assert fail_dead_trials(study, open_storage(JOURNAL)) == []


def test_the_trial_options_are_made_once_per_sweep(tmp_path: Path) -> None:
    options = TrainOptions(sweep=4, monitor="val", seed=3, study="s")
    base = without_sweep(options)
    assert _trial_options(base, "s", 0) is base  # no --checkpoint: shared
    assert base.sweep is None
    assert base.seed is None
    assert base.monitor is None
    checkpointed = TrainOptions(sweep=4, monitor="val", checkpoint=str(tmp_path))
    one = _trial_options(without_sweep(checkpointed), "s", 7)
    assert one.checkpoint == str(tmp_path / "s-trial-007")
    assert one.sweep is None


def test_a_trial_starts_in_the_sidebar_with_no_progress_of_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    notice = SweepNotice("s", 3, TrainOptions(sweep=3, monitor="val"), None)
    assert notice.status is not None
    last = dataclasses.replace(IDLE, steps=40, last_loss=0.5)
    notice.status.follow(lambda: last)  # what the first trial's run left it following
    notice.trial(2)
    status = json.loads(notice.status.path.read_text())
    assert status["run_name"] == "sweep s: trial 2 of 3"
    assert status["steps"] == 0
    assert status["last_loss"] is None
    path = notice.status.path
    notice.end("finished", None)
    assert not path.exists()


def test_a_journal_is_opened_once_per_process_while_its_file_stays_the_same() -> None:
    first = kept_storage(JOURNAL)
    optuna.create_study(study_name="a", storage=first).ask()
    assert kept_storage(JOURNAL) is first  # the next sweep reads only what was appended
    # another writer (a --parallel worker, another kernel) appends: the kept storage sees it
    other = optuna.create_study(study_name="b", storage=open_storage(JOURNAL))
    other.tell(other.ask(), 2.0)
    kept = optuna.load_study(study_name="b", storage=kept_storage(JOURNAL))
    assert [t.value for t in kept.trials] == [2.0]
    # the journal deleted (the user cleared runs/): opened anew, the old studies gone
    JOURNAL.unlink()
    fresh = kept_storage(JOURNAL)
    assert fresh is not first
    assert optuna.get_all_study_names(fresh) == []
    optuna.create_study(study_name="c", storage=fresh)
    # replaced by another journal (a copy put in its place): opened anew, what the copy holds
    copy = JOURNAL.with_name("copy.journal")
    optuna.create_study(study_name="d", storage=open_storage(copy))
    copy.replace(JOURNAL)
    assert optuna.get_all_study_names(kept_storage(JOURNAL)) == ["d"]
    # rewritten in place to a shorter file (same inode): opened anew
    before = kept_storage(JOURNAL)
    JOURNAL.write_bytes(b"")
    optuna.create_study(study_name="e", storage=open_storage(JOURNAL))
    now = kept_storage(JOURNAL)
    assert now is not before
    assert optuna.get_all_study_names(now) == ["e"]


def test_a_second_sweep_in_the_kernel_sees_the_first_and_resumes_it() -> None:
    """Two sweeps of one cell through the kept journal: the second is a new study (`-2`), and
    `--resume` continues that one with its trials kept."""
    ip = shell()
    sweep(ip, "--sweep 2 --monitor val --seed 0", SUGGEST_CELL)
    first = last()
    sweep(ip, "--sweep 1 --monitor val --seed 0", SUGGEST_CELL)
    second = last()
    assert second.study == f"{first.study}-2"
    sweep(ip, "--sweep 2 --monitor val --seed 0 --resume", SUGGEST_CELL)
    resumed = last()
    assert resumed.study == second.study
    assert len(resumed.trials) == 2
    assert resumed.trials[0].params == second.trials[0].params
    stored = optuna.load_study(study_name=first.study, storage=open_storage(JOURNAL))
    assert len(stored.trials) == 2


def test_after_ctrl_c_the_next_sweep_opens_the_journal_anew() -> None:
    """Ctrl-C may stop the kept storage between reading a record and applying it: the sweep
    after it replays the journal from a fresh storage, and `--resume` finds every trial."""
    ip = shell()
    sweep(ip, "--sweep 1 --monitor val --study a --seed 0", SUGGEST_CELL)
    kept = kept_storage(JOURNAL)
    cell = "run_no += 1\nif run_no == 2:\n    raise KeyboardInterrupt\n" + SUGGEST_CELL
    result = ip.run_cell(  # type: ignore[no-untyped-call]
        f"%%train --display text --tensorboard off --sweep 2 --monitor val --study s\n{cell}"
    )
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert kept_storage(JOURNAL) is not kept
    sweep(ip, "--sweep 2 --monitor val --study s --resume", cell)
    assert [t.state for t in last().trials] == ["complete", "failed", "complete"]


class _LockFile:
    """A journal lock that makes its file, then is interrupted before it returns (a Ctrl-C
    landing there: the window in which Optuna's own lock left its file behind)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def acquire(self) -> bool:
        self.path.touch()
        os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs
        return True

    def release(self) -> None:
        self.path.unlink()


def test_a_ctrl_c_while_the_journal_is_locked_waits_for_the_lock_to_go(tmp_path: Path) -> None:
    from jupyter_trainmate.sweep.storage import _SignalsHeld

    lock = _SignalsHeld(_LockFile(tmp_path / "journal.lock"))
    assert lock.acquire()  # no KeyboardInterrupt while the lock is held
    assert (tmp_path / "journal.lock").exists()
    with pytest.raises(KeyboardInterrupt):
        lock.release()  # the Ctrl-C, once the lock file is gone
    assert not (tmp_path / "journal.lock").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # the storage a sweep opens uses it: a real journal, written under the shielded lock
    storage = open_storage(tmp_path / "optuna.journal")
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": 1.0})
    assert not list(tmp_path.glob("*.lock"))
