"""
Run one `%%train` cell: rewrite it, run it under a `TrainSession`, undo everything after.

Kept apart from `magic.py` (argument parsing only) so the same path serves tests and tools.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .display.live import LiveDisplay
from .display.state import Snapshot
from .errors import NanDetected, TrainmateError
from .explain.kinds import Explanation
from .rewrite import SESSION, CodeFacts, RewriteResult, compile_rewritten, rewrite_cell
from .rewrite.install import Installed
from .runtime.checkpoint import checkpoints
from .runtime.checkpoint import load as load_checkpoint
from .runtime.guards import StopRun
from .runtime.notebook import notebook_path, runs_folder
from .runtime.observe import observe_backwards
from .runtime.oom import wants_retry
from .runtime.options import HelpShown, TrainOptions, parse_options
from .runtime.records import (
    append_record,
    compact_curves,
    git_commit,
    hyperparameters,
    make_record,
)
from .runtime.session import TrainSession
from .runtime.status import StatusWriter
from .runtime.summary import Outcome, RunSummary, remember_last_run
from .runtime.tensorboard import TensorBoardLog, run_folder, wanted

T = TypeVar("T")


def show(result: RewriteResult) -> str:
    """What `%%train --show` prints: the code that would run, then the notes."""
    parts = ["# --- cell, as %%train runs it ---", result.code.rstrip()]
    for fn in result.functions:
        what = f"{fn.original.kind} {fn.original.name}"
        parts += [f"\n# --- {what}, rewritten for the run ---", fn.code.rstrip()]
    parts.append("\n# --- what %%train did ---")
    parts += [f"# {note}" for note in result.notes] or ["# nothing: the cell runs unchanged"]
    if result.merged_facts().backward_calls == 0:  # see `runtime.observe`
        parts.append(
            "# no backward() in the cell or the functions it reaches: during the run "
            "torch.Tensor.backward reports each call's loss (the curve, --monitor loss), "
            "nothing more"
        )
    return "\n".join(parts)


def _gradient_reader(facts: CodeFacts) -> str | None:
    """The first code that reads gradients the session cannot unscale first, as `code (line N)`."""
    if not facts.gradient_reads:
        return None
    line, code = facts.gradient_reads[0]
    return f"{code} (line {line})"


def _run_name(result: RewriteResult) -> str:
    """A short name for the run: what its first batch loop iterates, else the first thing seen."""
    if result.batch_sources:
        return result.batch_sources[0]
    return result.instrumented[0].what if result.instrumented else "training cell"


@dataclasses.dataclass(frozen=True)
class RunHooks:
    """What a caller running the cell adds to a run. `on_created` sees the session as soon as it
    exists, before anything starts (a worker of `--procs` wires it into its process group);
    `on_session` is called with the session just before the cell runs (a sweep's trial: its
    `on_log` listeners then come last); `record` gives extra keys for the run record;
    `write_record=False` writes none (the `--procs` workers but rank 0); `keep_record` receives
    the record instead of the runs file (rank 0 of `--procs`: the notebook's process writes it,
    with every rank's samples); `status`: a status file the caller owns (a sweep's, started and
    ended by it), shown for this run instead of one of its own (no toast per trial);
    `quiet_end`: its ended record raises no toast or webhook (a trial of `--parallel`);
    `name`: the name of the run's TensorBoard folder, instead of what its batch loop iterates (a
    sweep's trial: `trial-NNN-STUDY`; trials of one cell a second apart shared one folder, which
    TensorBoard shows as one run)."""

    on_created: Callable[[TrainSession], None] | None = None
    on_session: Callable[[TrainSession], None] | None = None
    record: Callable[[], dict[str, Any]] | None = None
    write_record: bool = True
    keep_record: Callable[[dict[str, Any]], None] | None = None
    status: StatusWriter | None = None
    quiet_end: bool = False
    name: str | None = None


def rewrite_for(
    source: str,
    namespace: Mapping[str, object],
    options: TrainOptions,
    handed: frozenset[object] = frozenset(),
) -> RewriteResult:
    """The rewrite a run with `options` executes: retry points in its batch loops where
    `--oom-retry` wants them (`runtime.oom.wants_retry`), so every caller decides alike."""
    return rewrite_cell(source, namespace, handed, retry=wants_retry(options.oom_retry))


def run_cell(
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    result: RewriteResult | None = None,
    hooks: RunHooks | None = None,
) -> RunSummary:
    """Rewrite and run `source` in `namespace`. Re-raises what the cell raised, after cleaning up.

    `hooks` are what a sweep's trial or a `--procs` worker adds to the run (see `RunHooks`).

    `filename` is where the cell's source is registered for tracebacks (IPython's compiler cache
    in a notebook): the rewrite keeps line numbers, so tracebacks show the user's own lines.

    Every resource registers its undo on one `ExitStack` as it is created, and the undos run in
    reverse: the display thread halts, the status file goes, the session leaves the namespace,
    swapped functions come back, the session closes (checkpoints written, hooks and autocast
    undone), then the final display, the TensorBoard log and the run record, which is always
    written. An undo that fails is reported as an event (see `_Undos`) and never replaces the
    cell's own exception or KeyboardInterrupt; when the cell succeeded, a failed checkpoint write
    is raised after everything is undone.

    A failed run is explained (`RunSummary.error`, shown by the display above the traceback).
    With `--retries N`, a failure a restart can cure (`explain.build.restartable`) reruns the
    cell resuming from the latest checkpoint, as `--resume` does, at most N times; each attempt
    has its display and its run record, and says why it restarted.
    """
    __tracebackhide__ = True
    result = result or rewrite_for(source, namespace, options)
    attempt = _Attempt()
    while True:
        try:
            return _run_once(source, filename, options, namespace, result, attempt, hooks)
        except Exception:
            if not attempt.restart:
                raise
            attempt.number += 1
            attempt.restart = False
            options = dataclasses.replace(options, resume=True)


@dataclasses.dataclass
class _Attempt:
    """Restarts of one `%%train` run under `--retries`."""

    number: int = 0  # restarts so far
    why: str = ""  # what the last failed attempt was
    restart: bool = False  # set by a failed attempt that a restart may cure


def _run_once(
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    result: RewriteResult,
    attempt: _Attempt,
    hooks: RunHooks | None,
) -> RunSummary:
    __tracebackhide__ = True
    facts = result.merged_facts()
    if options.accumulate > 1 and facts.manual_accumulation_line is not None:
        raise TrainmateError(
            f"--accumulate {options.accumulate}: the loop already accumulates gradients by hand "
            f"(line {facts.manual_accumulation_line}); drop one of the two"
        )
    if options.accumulate > 1 and facts.own_scaler:
        raise TrainmateError(
            f"--accumulate {options.accumulate}: the cell runs its own GradScaler; accumulate there"
        )
    use_tensorboard = wanted(options.tensorboard)
    session = TrainSession(
        options,
        namespace,
        own_amp=facts.own_amp,
        saw_backward=facts.backward_calls > 0,
        instrumented=tuple(str(n) for n in result.instrumented),
        left_alone=tuple(str(n) for n in result.left_alone),
        reads_gradients=_gradient_reader(facts),
    )
    session.checkpoints.carried = result.carried
    if options.resume:
        session.checkpoints.made_by_cell = _cell_assigns(source)
    hooks = hooks or RunHooks()
    if hooks.on_created is not None:
        hooks.on_created(session)
    code = compile_rewritten(result.code, source, filename)
    notebook = notebook_path(namespace)
    run = _Run(session)
    undos = _Undos(run)
    with contextlib.ExitStack() as stack:
        if hooks.write_record:
            stack.callback(
                undos.guarded("run record", _write_run_record, run, options, namespace, hooks)
            )
        finals = stack.enter_context(contextlib.ExitStack())  # after the session closed
        stack.callback(undos.guarded("session close", run.close))
        stack.callback(undos.guarded("checkpoint", session.checkpoints.wait))
        if options.resume:
            assert session.checkpoint_dir is not None
            found = checkpoints(session.checkpoint_dir)
            if not found:
                raise TrainmateError(f"--resume: no checkpoint in {session.checkpoint_dir}")
            session.resume_from(load_checkpoint(found[-1]))
            if attempt.number:
                session.event(
                    f"restart {attempt.number} of {options.retries} after {attempt.why}: "
                    f"resumed from {found[-1].name}"
                )
        _install(session, namespace, result, stack, undos)
        if facts.backward_calls == 0:  # any backward() runs out of the rewrite's reach
            stack.callback(undos.guarded("restore", observe_backwards(session.observed_backward)))
        session.start()
        status = hooks.status
        if status is not None:  # the caller's (a sweep's): it shows this run; the caller ends it
            status.follow(session.progress)
        else:
            status = StatusWriter(
                session.progress,
                notebook=notebook,
                run_name=_run_name(result),
                notify_after=options.notify_after,
            )
            status.start_later()  # written from the run's first second on (display thread)
            stack.callback(undos.guarded("status file", status.stop))
            finals.callback(
                undos.guarded(
                    "status file",
                    lambda: status.finish(
                        run.final_summary(), restarted=attempt.restart, quiet=hooks.quiet_end
                    ),
                )
            )
        tensorboard = None
        if use_tensorboard:
            folder = run_folder(runs_folder(notebook), hooks.name or _run_name(result))
            tensorboard = TensorBoardLog(folder, _options_text(options))
            session.on_log.append(tensorboard.metrics)
            run.tensorboard = tensorboard
        live = LiveDisplay(
            session,
            options.display,
            f"%%train {_run_name(result)}",
            facts.item_lines,
            status,
            tensorboard,
        )
        if tensorboard is not None:
            finals.callback(undos.guarded("TensorBoard", run.close_tensorboard, live))
        finals.callback(undos.guarded("display", run.finish_display, live))
        live.start()
        stack.callback(undos.guarded("display", live.halt))
        if hooks.on_session is not None:
            hooks.on_session(session)
        try:
            exec(code, namespace)
            run.outcome = "finished"
        except StopRun as stop:
            run.outcome = "stopped early"
            session.event(f"stopped early: {stop.reason}")
            if session.checkpoint_dir is not None:
                undos.guarded("checkpoint", session.checkpoint_after_error, "stopped early")()
        except KeyboardInterrupt:
            run.outcome = "interrupted"
            undos.guarded("checkpoint", session.checkpoint_after_error, "interrupted")()
            raise
        except NanDetected as exc:  # --on-nan stop: a one-line error, explained
            run.error = _explain(exc, namespace, filename, options)
            raise
        except TrainmateError:
            raise
        except Exception as exc:
            what = f"failed ({type(exc).__name__})"
            undos.guarded("checkpoint", session.checkpoint_after_error, what)()
            run.error = _explain(exc, namespace, filename, options, attempt.number)
            _decide_restart(exc, run, options, attempt)
            raise
    undos.raise_checkpoint_failure()
    return run.final_summary()


class _Run:
    """What the undos of one run share: its outcome, its summary once made, and its outputs."""

    def __init__(self, session: TrainSession) -> None:
        self.session = session
        self.outcome: Outcome = "failed"
        self.summary: RunSummary | None = None
        self.tensorboard: TensorBoardLog | None = None
        self.late_events: list[str] = []  # failed undos after the summary was made
        self.error: Explanation | None = None  # why the cell failed
        self.final: Snapshot | None = None  # the display's last state: curves, advice (record)

    def close(self) -> None:
        self.summary = self.session.close(self.outcome)
        if self.error is not None:  # last_run().error
            remember_last_run(self.final_summary())

    def final_summary(self) -> RunSummary:
        """The summary, with what failed after it was made; made here if closing failed."""
        summary = self.summary
        if summary is None:  # the session's close failed: a summary of what is known
            self.summary = summary = self.session.summary(self.outcome)
        if self.late_events:
            summary = dataclasses.replace(summary, events=(*summary.events, *self.late_events))
        if self.error is not None and summary.error is None:
            summary = dataclasses.replace(summary, error=self.error)
        return summary

    def finish_display(self, live: LiveDisplay) -> None:
        self.final = live.finish(self.final_summary())
        if live.finish_failure is not None:  # shown by the text view: for the record only
            self.late_events.append(live.finish_failure)

    def close_tensorboard(self, live: LiveDisplay) -> None:
        assert self.tensorboard is not None
        self.tensorboard.close(self.final_summary(), live.state.progress)


class _Undos:
    """Wraps each undo so that a failure is reported, never raised over the cell's exception."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        self.checkpoint_failure: TrainmateError | None = None

    def guarded(self, what: str, undo: Callable[..., object], *args: Any) -> Callable[[], None]:
        def run_undo() -> None:
            try:
                undo(*args)
            except Exception as exc:
                self.report(what, exc)

        return run_undo

    def report(self, what: str, exc: Exception) -> None:
        """An event in the widget/text view and the run record, and a line when it is too late
        for the display to show it."""
        if what == "checkpoint" and isinstance(exc, TrainmateError):
            message = str(exc)  # "checkpoint not written: ..."
            self.checkpoint_failure = self.checkpoint_failure or exc
        else:
            message = f"{what} failed: {type(exc).__name__}: {exc}"
        run = self._run
        if run.summary is None:
            run.session.event(message)
        else:
            run.late_events.append(message)
            print(f"trainmate: {message}", flush=True)

    def raise_checkpoint_failure(self) -> None:
        """After a cell that succeeded: a checkpoint that was not written fails the run."""
        if self.checkpoint_failure is not None:
            raise self.checkpoint_failure


def _explain(
    exc: BaseException,
    namespace: dict[str, Any],
    filename: str,
    options: TrainOptions,
    restarts: int = 0,
) -> Explanation | None:
    """The explanation of the cell's exception; None if explaining failed (never a new error).
    `restarts`: the run's restarts so far under `--retries` (the advice depends on them)."""
    try:
        from .explain.build import explain

        left = options.retries - restarts
        return explain(exc, namespace, {filename}, amp=options.amp, retries=(restarts, left))
    except Exception:
        return None


def _decide_restart(exc: Exception, run: _Run, options: TrainOptions, attempt: _Attempt) -> None:
    """Under `--retries`: whether this failure restarts the run from its latest checkpoint."""
    from .explain.build import restartable

    directory = run.session.checkpoint_dir
    if attempt.number >= options.retries or directory is None or not restartable(exc):
        return
    run.session.checkpoints.wait()  # the checkpoint of the failed step, on disk
    if not checkpoints(directory):
        run.session.event("not restarted: no checkpoint was written before the failure")
        return
    known = run.error.kind if run.error is not None else "unknown"
    kind = known if known != "unknown" else "a transient failure"
    first = (str(exc).strip().splitlines() or [""])[0][:120]
    attempt.why = f"{kind} ({type(exc).__name__}: {first})"
    attempt.restart = True
    run.session.event(
        f"{attempt.why}: restarting from the latest checkpoint "
        f"({attempt.number + 1} of {options.retries})"
    )


def _install(
    session: TrainSession,
    namespace: dict[str, Any],
    result: RewriteResult,
    stack: contextlib.ExitStack,
    undos: _Undos,
) -> None:
    """Make the session reachable as `__trainmate__` from the cell, and swap in the rewritten
    functions and methods (each put back when the cell ends, however it ends)."""
    namespace[SESSION] = session
    stack.callback(undos.guarded("session", namespace.pop, SESSION, None))
    rewritten = Installed(result, namespace)
    stack.callback(undos.guarded("restore", rewritten.undo))
    rewritten.install(session)


def _options_text(options: TrainOptions) -> str:
    """The run's options as `%%train` flags (TensorBoard's text tab)."""
    changed = [
        f"--{name.replace('_', '-')} {value}"
        for name, default in _option_defaults()
        if (value := getattr(options, name)) != default
    ]
    return "%%train " + " ".join(changed) if changed else "%%train (defaults)"


@functools.cache
def _option_defaults() -> tuple[tuple[str, Any], ...]:
    """(name, default) of every option, read once (a `TrainOptions()` checks every field)."""
    default = TrainOptions()
    return tuple((f.name, getattr(default, f.name)) for f in dataclasses.fields(default))


def _cell_assigns(source: str) -> frozenset[str]:
    """The names the cell's own statements assign, outside its loops and functions (`model =
    Net()`, `model, opt = build()`, inside a top-level `if`, `with` or `try` too): the objects a
    resumed run may find made anew (`Checkpoints.made_anew`). A loop's target (`for net in
    nets:`) is none of them: it names an object made elsewhere."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return frozenset()
    names: set[str] = set()
    blocks: list[list[ast.stmt]] = [tree.body]
    while blocks:
        for statement in blocks.pop():
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign):
                targets = [statement.target]
            else:
                if isinstance(statement, ast.If | ast.With | ast.Try):
                    blocks += [statement.body, getattr(statement, "orelse", [])]
                if isinstance(statement, ast.Try):
                    blocks += [statement.finalbody, *(h.body for h in statement.handlers)]
                continue
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return frozenset(names)


def _write_run_record(
    run: _Run, options: TrainOptions, namespace: dict[str, Any], hooks: RunHooks | None = None
) -> None:
    """Append the run's line to `runs/runs.jsonl` (see `runtime.records`)."""
    summary, session, tensorboard = run.final_summary(), run.session, run.tensorboard
    notebook = notebook_path(namespace)
    info = session.loader_info
    hyper = hyperparameters(namespace, info.batch_size if info else None, session.epochs_total)
    record = make_record(
        summary,
        options,
        notebook=notebook,
        hyper=hyper,
        checkpoint=session.last_checkpoint,
        commit=git_commit(os.path.dirname(notebook) if notebook else os.getcwd()),
    )
    record["tensorboard"] = str(tensorboard.folder) if tensorboard is not None else None
    if run.final is not None:
        record["curves"] = compact_curves(run.final.loss, run.final.metrics)
        record["advice"] = [{"rule": a.rule, "message": a.message} for a in run.final.advice]
    if hooks is not None and hooks.record is not None:
        record.update(hooks.record())
    if hooks is not None and hooks.keep_record is not None:
        hooks.keep_record(record)
        return
    try:
        append_record(runs_folder(notebook), record)
    except OSError as exc:  # a read-only folder must not turn a finished run into an error
        print(f"trainmate: run record not written: {exc}")


def train(fn: Callable[..., T], options: str = "", /, **kwargs: Any) -> T:
    """Run `fn(**kwargs)` the way `%%train OPTIONS` runs a cell that calls it, anywhere.

    The function is rewritten like a notebook function (batch loops timed and prefetched,
    backward/step through the session, AMP, guards, checkpoints, run records, the display: text
    outside a notebook), so a package made from a notebook by `trainmate refactor` trains the
    same way as the notebook did. Name the models, optimizers and schedulers in `kwargs`:
    checkpoints and `--resume` find them by those names.

    ```python
    from jupyter_trainmate import train
    train(fit, "--amp bf16 --checkpoint ckpt", model=model, optimizer=opt, loader=loader)
    ```

    `--sweep N` runs through `jupyter_trainmate.train` (`train_call` with the sweep's hooks).
    """
    return train_call(fn, options, kwargs, None)


@dataclasses.dataclass(frozen=True)
class SweepHooks:
    """How `train_call` runs `--sweep` (`sweep/function.py`'s, given by `jupyter_trainmate.train`:
    the sweep driver imports this module). `requested`: the options under the package command's
    request; `run(name, source, filename, options, namespace, result)`: the study over the call."""

    requested: Callable[[TrainOptions], TrainOptions]
    run: Callable[[str, str, str, TrainOptions, dict[str, Any], RewriteResult], None]


def train_call(
    fn: Callable[..., T], options: str, kwargs: dict[str, Any], sweeps: SweepHooks | None
) -> T:
    """`train(fn, options, **kwargs)`; with `sweeps`, `--sweep N` runs the study of `%%train
    --sweep N` over `fn` (in `runs/optuna.journal` of the working directory; the result is the
    last trial's, None with `--parallel`, whose workers train copies)."""
    name = fn.__name__
    if not name.isidentifier() or name in kwargs:
        raise TrainmateError(f"train(): cannot call {name!r} with arguments {sorted(kwargs)}")
    namespace: dict[str, Any] = {**kwargs, name: fn}
    try:
        parsed = parse_options(options)
    except HelpShown:
        raise TrainmateError(f"train(): {options!r} asks for help; see %%train --help") from None
    if parsed.procs is not None:  # the notebook's magic runs it; here: torchrun
        raise TrainmateError(
            "train(): --procs runs from a %%train cell; in a script, start it under torchrun"
        )
    if sweeps is not None:  # `python -m PKG sweep --trials N` / `train` (one run)
        parsed = sweeps.requested(parsed)
    elif parsed.sweep is not None:
        raise TrainmateError("train(): --sweep runs through jupyter_trainmate.train")
    arguments = ", ".join(f"{k}={k}" for k in kwargs)
    source = f"{_RESULT} = {name}({arguments})\n"
    # `fn` is rewritten wherever it was defined; nothing is written on it (it is the user's).
    result = rewrite_for(source, namespace, parsed, handed=frozenset({fn}))
    if parsed.sweep is None or sweeps is None:
        run_cell(source, "<jupyter_trainmate.train>", parsed, namespace, result, _rank_hooks())
        return namespace[_RESULT]  # type: ignore[no-any-return]
    sweeps.run(name, source, "<jupyter_trainmate.train>", parsed, namespace, result)
    return namespace.get(_RESULT)  # type: ignore[return-value]


_RESULT = "__trainmate_result__"


def _rank_hooks() -> RunHooks | None:
    """Under torchrun (a refactored package's `train`): every rank trains, rank 0 alone writes
    the run record and checkpoints, as the workers of `%%train --procs` do."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        return None

    def quiet(session: TrainSession) -> None:
        session.checkpoints.writes = False

    return RunHooks(on_created=quiet, write_record=False)
