"""
Run one `%%train` cell: rewrite it, run it under a `TrainSession`, undo everything after.

Kept apart from `magic.py` (argument parsing only) so the same path serves tests and tools.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .display.live import LiveDisplay
from .errors import TrainmateError
from .rewrite import SESSION, CodeFacts, RewriteResult, compile_rewritten, rewrite_cell
from .rewrite.install import Installed
from .runtime.checkpoint import checkpoints
from .runtime.checkpoint import load as load_checkpoint
from .runtime.guards import StopRun
from .runtime.options import HelpShown, TrainOptions, parse_options
from .runtime.records import (
    append_record,
    git_commit,
    hyperparameters,
    make_record,
    runs_folder,
)
from .runtime.session import TrainSession
from .runtime.status import StatusWriter, notebook_path
from .runtime.summary import Outcome, RunSummary
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


def run_cell(
    source: str,
    filename: str,
    options: TrainOptions,
    namespace: dict[str, Any],
    result: RewriteResult | None = None,
) -> RunSummary:
    """Rewrite and run `source` in `namespace`. Re-raises what the cell raised, after cleaning up.

    `filename` is where the cell's source is registered for tracebacks (IPython's compiler cache
    in a notebook): the rewrite keeps line numbers, so tracebacks show the user's own lines.
    """
    __tracebackhide__ = True
    result = result or rewrite_cell(source, namespace)
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
    code = compile_rewritten(result.code, source, filename)
    rewritten = Installed(result, namespace)
    outcome: Outcome = "failed"
    status: StatusWriter | None = None
    live: LiveDisplay | None = None
    tensorboard: TensorBoardLog | None = None
    try:
        if options.resume:
            assert session.checkpoint_dir is not None
            found = checkpoints(session.checkpoint_dir)
            if not found:
                raise TrainmateError(f"--resume: no checkpoint in {session.checkpoint_dir}")
            session.resume_from(load_checkpoint(found[-1]))
        namespace[SESSION] = session
        rewritten.install(session)
        session.start()
        status = StatusWriter(
            session.progress, notebook=notebook_path(namespace), run_name=_run_name(result)
        )
        with contextlib.suppress(OSError):  # no runtime dir (read-only home): no sidebar entry
            status.start()
        if use_tensorboard:
            folder = run_folder(runs_folder(notebook_path(namespace)), _run_name(result))
            tensorboard = TensorBoardLog(folder, _options_text(options))
            session.on_log.append(tensorboard.metrics)
        live = LiveDisplay(
            session,
            options.display,
            f"%%train {_run_name(result)}",
            facts.item_lines,
            status,
            tensorboard,
        )
        live.start()
        exec(code, namespace)
        outcome = "finished"
    except StopRun as stop:
        outcome = "stopped early"
        session.event(f"stopped early: {stop.reason}")
        if session.checkpoint_dir is not None:
            session.checkpoint_after_error("stopped early")
    except KeyboardInterrupt:
        outcome = "interrupted"
        session.checkpoint_after_error("interrupted")
        raise
    except TrainmateError:
        raise
    except Exception as exc:
        session.checkpoint_after_error(f"failed ({type(exc).__name__})")
        raise
    finally:
        if live is not None:
            live.halt()
        if status is not None:
            status.stop()
        namespace.pop(SESSION, None)
        rewritten.undo()
        summary = session.close(outcome)
        if live is not None:
            live.finish(summary)
        if tensorboard is not None:
            try:
                tensorboard.close(summary, live.state.progress if live is not None else None)
            except OSError as exc:  # a read-only folder must not turn a finished run into an error
                print(f"trainmate: TensorBoard events not written: {exc}")
        _record(summary, options, session, namespace, tensorboard)
    return summary


def _options_text(options: TrainOptions) -> str:
    """The run's options as `%%train` flags (TensorBoard's text tab)."""
    default = TrainOptions()
    changed = [
        f"--{f.name.replace('_', '-')} {getattr(options, f.name)}"
        for f in dataclasses.fields(options)
        if getattr(options, f.name) != getattr(default, f.name)
    ]
    return "%%train " + " ".join(changed) if changed else "%%train (defaults)"


def _record(
    summary: RunSummary,
    options: TrainOptions,
    session: TrainSession,
    namespace: dict[str, Any],
    tensorboard: TensorBoardLog | None = None,
) -> None:
    notebook = notebook_path(namespace)
    info = session.loader_info
    hyper = hyperparameters(namespace, info.batch_size if info else None, session.epochs_total)
    record = make_record(
        summary,
        options,
        notebook=notebook,
        hyper=hyper,
        checkpoint=session.last_checkpoint,
        commit=git_commit(Path(notebook).parent if notebook else Path.cwd()),
    )
    record["tensorboard"] = str(tensorboard.folder) if tensorboard is not None else None
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
    """
    name = fn.__name__
    if not name.isidentifier() or name in kwargs:
        raise TrainmateError(f"train(): cannot call {name!r} with arguments {sorted(kwargs)}")
    namespace: dict[str, Any] = {**kwargs, name: fn}
    try:
        parsed = parse_options(options)
    except HelpShown:
        raise TrainmateError(f"train(): {options!r} asks for help; see %%train --help") from None
    arguments = ", ".join(f"{k}={k}" for k in kwargs)
    source = f"{_RESULT} = {name}({arguments})\n"
    # `fn` is rewritten wherever it was defined; nothing is written on it (it is the user's).
    result = rewrite_cell(source, namespace, handed=frozenset({fn}))
    run_cell(source, "<jupyter_trainmate.train>", parsed, namespace, result)
    return namespace[_RESULT]  # type: ignore[no-any-return]


_RESULT = "__trainmate_result__"
