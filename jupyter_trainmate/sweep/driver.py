"""
`%%train --sweep N`: the study loop around `runner.run_cell`.

Each trial is one ordinary `%%train` run of the cell, with its own `TrainOptions` (the sweep's
options, minus the sweep): the same AMP, prefetching, guards, checkpoints (in a folder per
trial), run record (with a `"sweep"` key: study, trial, params) and training widget. The study
lives in `runs/optuna.journal` (`storage.py`); trials are asked and told one at a time.

- `suggest()` reads the trial set here (`suggest.set_current`); with `--space`, the notebook's
  training objects are restored from a snapshot taken before the first trial and the trial's
  settings written into the optimizers' param groups (`space.py`).
- Every `jupyter_trainmate.log(MONITOR=...)` is reported to the trial; when the pruner says so,
  `StopRun` ends the run the way early stopping does, and the trial is PRUNED.
- The trial's value is the best reported value of `--monitor` (by `--mode`).
- A trial that raises (or stops on a NaN) is FAILED with its reason and the search goes on,
  until `--max-failures` fail in a row. A usage error (a bad `suggest()`) ends the search.
- Ctrl-C ends the trial in progress (its checkpoint written, as on any interrupt), marks it
  FAILED (interrupted), shows the study so far and re-raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NanDetected, TrainmateError
from ..runtime.guards import StopRun
from ..runtime.notebook import notebook_path, runs_folder
from ..runtime.options import TrainOptions
from . import storage as store
from .notice import SweepNotice
from .space import Snapshot, check_settings, parse_space
from .suggest import Param, cell_params, set_current
from .summary import (
    SweepSummary,
    importances,
    last_sweep,
    remember_last_sweep,
    summarise,
    trial_record,
)
from .view import SweepView

if TYPE_CHECKING:
    import optuna

    from ..rewrite import RewriteResult
    from ..runtime.session import TrainSession


def study_name(options: TrainOptions, source: str, notebook: str | None) -> str:
    """`--study NAME`, else the notebook's stem and a hash of the cell."""
    if options.study:
        return options.study
    stem = Path(notebook).stem if notebook else "sweep"
    return f"{stem}-{hashlib.sha1(source.strip().encode()).hexdigest()[:8]}"


def _pick_name(base: str, exists: Callable[[str], bool], resume: bool, explicit: bool) -> str:
    """The study to use: with --resume the newest of that name; else a new one (`base-2`, ...).
    `exists` asks the storage about one name (`_study_exists`): only the names tried are read."""
    taken = [base] if exists(base) else []
    n = 2
    while exists(f"{base}-{n}"):
        taken.append(f"{base}-{n}")
        n += 1
    if resume:
        if not taken:
            hint = "" if explicit else " (the default name follows the cell's text: --study NAME)"
            raise TrainmateError(f"--resume: no study {base!r} in runs/{store.JOURNAL}{hint}")
        return taken[-1]
    if not taken:
        return base
    if explicit:
        raise TrainmateError(
            f"--study {base}: already in runs/{store.JOURNAL}; add --resume to continue it"
        )
    return f"{base}-{n}"


def _study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    """Whether the journal holds a study of that name: one lookup, where
    `optuna.get_all_study_names` deep-copies every study of the journal (a cost per sweep that
    grows with the journal: a cell re-run makes a study each time)."""
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def make_sampler(options: TrainOptions, grid: list[Param] | None) -> optuna.samplers.BaseSampler:
    import optuna

    seed = options.seed
    if options.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if options.sampler == "grid":
        assert grid is not None
        if not grid:
            raise TrainmateError(
                "--sampler grid: no suggest() call with literal arguments and no --space"
            )
        return _grid({p.name: list(p.grid()) for p in grid}, seed=seed)
    if options.sampler == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise TrainmateError(
                "--sampler cmaes needs the cmaes package: pip install cmaes"
            ) from None
        return optuna.samplers.CmaEsSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _grid(space: dict[str, list[Any]], seed: int | None) -> optuna.samplers.BaseSampler:
    import optuna

    class Grid(optuna.samplers.GridSampler):
        """Optuna's grid, without its `study.stop()` once the grid is done: that works only
        inside `study.optimize`, and the driver asks and tells (it stops at the grid's size)."""

        def after_trial(self, *args: Any, **kwargs: Any) -> None:
            pass

    return Grid(space, seed=seed)


def make_pruner(name: str) -> optuna.pruners.BasePruner:
    import optuna

    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1)
    if name == "median":
        # 2 complete trials before any pruning, never on the first report: on the reference task
        # (BENCHMARKS.md, `benchmarks/sweep_pruning.py`) 40% fewer trial-epochs than no pruning
        # at the same or a better best value on 8 seeds (3 start-up trials: 36%; pruning at the
        # first report, or after 1 trial, lost the best value on some seeds)
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


class _Trial:
    """One trial's run: reports the monitored metric to Optuna, prunes, keeps the best value."""

    def __init__(self, trial: optuna.Trial, options: TrainOptions, on_report: Any) -> None:
        self.trial = trial
        self.monitor = options.monitor or ""
        self.mode = options.mode
        self.prune = options.prune != "none"
        self.best = math.nan
        self.reports = 0
        self.pruned: str | None = None
        self.session: TrainSession | None = None
        self._on_report = on_report

    def attach(self, session: TrainSession) -> None:
        self.session = session
        session.on_log.append(self.logged)
        if self.monitor == "loss":  # the unchanged loop's own training loss, per epoch
            session.monitor_epoch_loss()

    def logged(self, step: int, values: dict[str, float]) -> None:
        if self.monitor not in values:
            return
        value = values[self.monitor]
        if math.isfinite(value) and (
            math.isnan(self.best)
            or (value < self.best if self.mode == "min" else value > self.best)
        ):
            self.best = value
        self.trial.report(value, self.reports)
        self.reports += 1
        self._on_report()
        if self.prune and self.trial.should_prune():
            self.pruned = f"pruned at report {self.reports}: {self.monitor}={value:.4g}"
            raise StopRun("pruned", self.pruned)

    def record(self) -> dict[str, Any]:
        return {
            "sweep": {
                "study": self.trial.study.study_name,
                "trial": self.trial.number,
                "params": dict(self.trial.params),
            }
        }


def without_sweep(options: TrainOptions) -> TrainOptions:
    """The options of one ordinary run: the sweep's own options back to their defaults (a
    sweep's `--resume` continues its study, not a checkpoint; `--monitor` stays only for early
    stopping)."""
    base = TrainOptions()
    return dataclasses.replace(
        options,
        sweep=None,
        resume=False,
        parallel=1,
        sampler=base.sampler,
        prune=base.prune,
        study=None,
        timeout=None,
        max_failures=base.max_failures,
        space=None,
        seed=None,
        monitor=options.monitor if options.patience is not None else None,
    )


def _trial_options(base: TrainOptions, name: str, number: int) -> TrainOptions:
    """The options of one trial's run: `base` (the sweep's, `without_sweep`, made once per sweep;
    frozen, so every trial without `--checkpoint` shares it), with checkpoints per trial."""
    if base.checkpoint is None:
        return base
    return dataclasses.replace(
        base, checkpoint=str(Path(base.checkpoint) / f"{name}-trial-{number:03d}")
    )


def trial_name(study: str, number: int) -> str:
    """A trial's run name (its TensorBoard folder): the number first, as the folder's name keeps
    only the first 40 characters."""
    return f"trial-{number:03d}-{study}"


def _uses_suggest(source: str, result: RewriteResult) -> bool:
    return "suggest" in source or any("suggest" in fn.code for fn in result.functions)


def run_sweep(
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    result: RewriteResult,
    parallel: Callable[..., SweepSummary] | None = None,
    default_name: str | None = None,
) -> SweepSummary:
    """Run the cell as `options.sweep` trials of an Optuna study; returns (and keeps for
    `last_sweep()`) the study's summary. Re-raises Ctrl-C after showing the study so far.
    `parallel` (`parallel.run_parallel`, given by the magic) runs the trials of `--parallel K`;
    `default_name` is the study's name without `--study` (`train()`: the function's)."""
    import optuna
    from optuna.trial import TrialState

    assert options.sweep is not None
    assert options.monitor is not None
    space = parse_space(options.space) if options.space is not None else None
    if space is not None:
        check_settings(space, namespace)
    elif not _uses_suggest(source, result):
        raise TrainmateError(
            f"--sweep {options.sweep}: nothing to search: call jupyter_trainmate.suggest() in "
            'the cell, or give --space "lr=1e-5..1e-2:log"'
        )
    grid = None
    if options.sampler == "grid":
        grid = space if space is not None else cell_params(source)
    notebook = notebook_path(namespace)
    journal = runs_folder(notebook) / store.JOURNAL
    storage = store.kept_storage(journal)  # opened once per process
    base = options.study or default_name or study_name(options, source, notebook)
    name = _pick_name(
        base, functools.partial(_study_exists, storage), options.resume, options.study is not None
    )
    if optuna.logging.get_verbosity() != optuna.logging.WARNING:
        # setting it clears the cache of every logger in the process (a few hundred here)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage,
        sampler=make_sampler(options, grid),
        pruner=make_pruner(options.prune),
        study_name=name,
        direction="maximize" if options.mode == "max" else "minimize",
        load_if_exists=True,
    )
    if options.resume:
        gone = store.fail_dead_trials(study, storage)
        if gone:
            print(f"trainmate sweep {name}: trial(s) {gone} of a process that ended marked failed")
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    todo = options.sweep - len(finished) if options.resume else options.sweep
    if grid is not None:
        size = math.prod(len(p.grid()) for p in grid)
        todo = min(todo, size - len(finished))
    notice = SweepNotice(name, todo, options, notebook)
    outcome = "failed"
    try:
        if options.parallel > 1 and parallel is not None:  # K at a time (sweep/parallel.py)
            done = parallel(source, filename, options, namespace, study, journal, todo)
        else:
            done = _run_trials(
                source, filename, options, namespace, result, study, space, todo, notice
            )
        outcome = "stopped early" if done.stopped else "finished"
        return done
    except KeyboardInterrupt:
        outcome = "interrupted"
        store.forget(journal)  # it may have stopped the storage mid-read: the next sweep opens it
        raise
    finally:
        notice.end(outcome, last_sweep())


def _run_trials(
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    result: RewriteResult,
    study: optuna.Study,
    space: list[Param] | None,
    todo: int,
    notice: SweepNotice,
) -> SweepSummary:
    """The trials of `run_sweep` in this process, one after another."""
    from ..runner import RunHooks, run_cell

    assert options.monitor is not None
    name = study.study_name
    snapshot = Snapshot.take(namespace) if space is not None else None
    base_options = without_sweep(options)
    view = SweepView(options.display, f"%%train --sweep {name}")

    def redraw() -> None:
        if view.live:  # the text view prints per trial: no study to read per report
            view.update(summarise(study, options.monitor or ""))

    started = time.monotonic()
    failures = 0
    stopped: str | None = None
    ran = 0
    while ran < todo:
        if options.timeout is not None and time.monotonic() - started > options.timeout:
            stopped = f"--timeout {options.timeout:g} s reached"
            break
        trial = study.ask()
        store.mark_process(trial)
        running = _Trial(trial, options, redraw)
        trial_options = _trial_options(base_options, name, trial.number)
        hooks = RunHooks(
            on_session=running.attach,
            record=running.record,
            status=notice.status,
            name=trial_name(name, trial.number),
        )
        notice.trial(ran + 1)
        redraw()
        set_current(trial)
        try:
            deferred: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
            if snapshot is not None and space is not None:
                snapshot.restore(namespace)
                deferred = snapshot.write({p.name: p.suggest(trial) for p in space}, namespace)
            with deferred, view.trial():
                run_cell(source, filename, trial_options, namespace, result, hooks)
        except KeyboardInterrupt:
            _fail(study, trial, running, "interrupted (Ctrl-C)")
            summary = summarise(study, options.monitor, stopped="interrupted (Ctrl-C)")
            remember_last_sweep(summary)
            view.finish(summary)
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            _fail(study, trial, running, reason)
            if isinstance(exc, TrainmateError) and not isinstance(exc, NanDetected):
                remember_last_sweep(summarise(study, options.monitor, stopped=reason))
                raise  # bad input: every trial would fail the same way
            failures += 1
            view.trial_done(trial_record(study.get_trials(deepcopy=False)[-1]))
            if failures >= options.max_failures:
                stopped = (
                    f"{failures} trials failed in a row (--max-failures {options.max_failures})"
                )
                break
            ran += 1
            continue
        finally:
            set_current(None)
        ran += 1
        _tell(study, trial, running)
        failures = 0 if running.pruned is not None or not math.isnan(running.best) else failures + 1
        view.trial_done(_frozen(study, trial.number))
        if failures >= options.max_failures:
            stopped = f"{failures} trials failed in a row (--max-failures {options.max_failures})"
            break
    summary = summarise(study, options.monitor, importances=importances(study), stopped=stopped)
    remember_last_sweep(summary)
    view.finish(summary)
    return summary


def _frozen(study: optuna.Study, number: int) -> Any:
    return trial_record(study.get_trials(deepcopy=False)[number])


def _checkpoint(running: _Trial) -> None:
    session = running.session
    if session is not None and session.last_checkpoint is not None:
        running.trial.set_user_attr(store.CHECKPOINT, str(session.last_checkpoint))


def _tell(study: optuna.Study, trial: optuna.Trial, running: _Trial) -> None:
    from optuna.trial import TrialState

    _checkpoint(running)
    if running.pruned is not None:
        trial.set_user_attr(store.REASON, running.pruned)
        study.tell(trial, state=TrialState.PRUNED)
    elif math.isnan(running.best):
        reason = f"never logged {running.monitor}"
        if running.monitor == "loss":
            reason = (
                "no training loss seen (no loss.backward() ran in the trial: "
                "torch.autograd.backward()?); log a metric with jupyter_trainmate.log()"
            )
        trial.set_user_attr(store.REASON, reason)
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, running.best)


def _fail(study: optuna.Study, trial: optuna.Trial, running: _Trial, reason: str) -> None:
    from optuna.trial import TrialState

    _checkpoint(running)
    trial.set_user_attr(store.REASON, reason)
    study.tell(trial, state=TrialState.FAIL)
