"""
A sweep of a function: `train(fn, "--sweep N --monitor M ...", **kwargs)`, the way a package
made by `trainmate refactor` runs its `%%train --sweep N` cell (`python -m PKG sweep`).

`jupyter_trainmate.train()` hands a `--sweep` to `sweep_call` (`hooks()`), which runs `driver.run_sweep` on the call it built
(each trial one `train()` run of `fn(**kwargs)`, `suggest()` read inside `fn`): the same study
loop, samplers, pruning, failures and Ctrl-C as the notebook's. The study is stored in
`runs/optuna.journal` of the working directory, named by `--study` or the function's name.

The package's `__main__` decides how many trials for the call deep in its `run()`:
`sweep_trials(N, K)` (`python -m PKG sweep --trials N --parallel K`: the code before the call
runs once, then the study, then the command ends: what follows the call in `run()` would see
only one trial's objects) or `no_sweep()` (`python -m PKG train`: one run, each `suggest()`
giving its default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..rewrite import RewriteResult
    from ..runner import SweepHooks
    from ..runtime.options import TrainOptions


@dataclasses.dataclass(frozen=True)
class _Request:
    trials: int | None  # None: one run, no sweep
    parallel: int | None = None  # None: the options'


_request: ContextVar[_Request | None] = ContextVar("trainmate_sweep_request", default=None)


class _SweepDone(Exception):  # not an error: the end of `sweep_trials`
    """Raised by `train()` after its sweep under `sweep_trials()`, which ends there."""


@contextmanager
def sweep_trials(trials: int, parallel: int | None = None) -> Iterator[None]:
    """Inside: a `train()` with `--sweep` runs `trials` trials (`parallel` at a time), and the
    block ends after that sweep."""
    token = _request.set(_Request(trials, parallel))
    try:
        yield
    except _SweepDone:
        pass
    finally:
        _request.reset(token)


@contextmanager
def no_sweep() -> Iterator[None]:
    """Inside: a `train()` with `--sweep` runs once, without the sweep (`suggest()` defaults)."""
    token = _request.set(_Request(None))
    try:
        yield
    finally:
        _request.reset(token)


def requested(options: TrainOptions) -> TrainOptions:
    """The options of a `train()` call as the current request has them: `--sweep` dropped under
    `no_sweep()`, its trials and `--parallel` replaced under `sweep_trials()`."""
    request = _request.get()
    if options.sweep is None or request is None:
        return options
    if request.trials is None:
        from .driver import without_sweep

        return without_sweep(options)
    return dataclasses.replace(
        options,
        sweep=request.trials,
        parallel=options.parallel if request.parallel is None else request.parallel,
    )


def sweep_call(
    name: str,
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    result: RewriteResult,
) -> None:
    """Run the call `source` (of the function `name`) as the trials of `options.sweep`; under
    `sweep_trials()`, end its block after."""
    from .driver import run_sweep
    from .parallel import run_parallel

    run_sweep(source, filename, options, namespace, result, run_parallel, default_name=name)
    if _request.get() is not None:
        raise _SweepDone


def hooks() -> SweepHooks:
    """What `jupyter_trainmate.train` gives `runner.train_call` to run a `--sweep`."""
    from ..runner import SweepHooks

    return SweepHooks(requested, sweep_call)
