"""IPython magics of jupyter_trainmate: argument parsing and wiring only."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .errors import TrainmateError

if TYPE_CHECKING:
    from .runtime.options import TrainOptions


def _checkpoint_dir(value: str | None, namespace: dict[str, object]) -> str | None:
    """`--checkpoint` alone: `checkpoints/` beside the notebook (or the working directory)."""
    if value is None or value:
        return value
    from .runtime.status import notebook_path

    notebook = notebook_path(namespace)
    base = Path(notebook).parent if notebook else Path.cwd()
    return str(base / "checkpoints")


class CellSyntaxError(Exception):
    """A syntax error in a `%%train` cell, shown the way IPython shows one in a plain cell.

    Not a SyntaxError subclass on purpose: IPython would print the magic's own frames for it.
    `_render_traceback_` is IPython's hook for an exception that formats itself.
    """

    def __init__(self, error: SyntaxError, formatter: Callable[..., list[str]]) -> None:
        super().__init__(f"{error.msg} (line {error.lineno})")
        self.error = error
        self._formatter = formatter

    def _render_traceback_(self) -> list[str]:
        return self._formatter(type(self.error), self.error, [])


@magics_class
class TrainmateMagics(Magics):
    """`%%train` runs a training cell instrumented; `%trainmate doctor` checks the machine."""

    @line_magic
    def trainmate(self, line: str) -> None:
        """Run a trainmate command in the kernel, e.g. `%trainmate doctor --json`."""
        from .cli import build_parser

        parser = build_parser()
        parser.prog = "%trainmate"
        try:
            args = parser.parse_args(shlex.split(line))
        except SystemExit as exc:  # argparse has printed usage or --help already
            if exc.code:
                raise UsageError(f"%trainmate {line}: see %trainmate --help") from None
            return
        try:
            args.run(args)
        except TrainmateError as exc:
            raise UsageError(f"%trainmate {args.command}: {exc}") from None

    @magic_arguments()
    @argument(
        "--amp", default="auto", help="auto|bf16|fp16|off (auto: bf16 or fp16 on GPUs, off on CPU)"
    )
    @argument(
        "--device", default="auto", help="auto|cpu|cuda|cuda:N|mps (auto: where the model is)"
    )
    @argument(
        "--accumulate", type=int, default=1, metavar="N", help="micro-batches per optimizer step"
    )
    @argument("--clip", type=float, default=None, metavar="MAX_NORM", help="clip the gradient norm")
    @argument(
        "--prefetch", default="auto", help="auto|off|cuda|thread (thread is opt-in: see docs)"
    )
    @argument(
        "--tune-loader",
        type=int,
        nargs="?",
        const=8,
        default=0,
        metavar="N",
        help="try DataLoader settings for N batches each on the first epoch, keep the fastest",
    )
    @argument(
        "--checkpoint",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="save checkpoints (default folder: checkpoints/ beside the notebook)",
    )
    @argument("--every", type=int, default=0, metavar="N", help="checkpoint every N steps")
    @argument("--keep", type=int, default=3, metavar="K", help="checkpoints to keep")
    @argument("--resume", action="store_true", help="continue from the last checkpoint")
    @argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --resume: change an optimizer setting, e.g. --set lr=3e-4 (repeatable)",
    )
    @argument("--on-nan", default="off", help="off|stop|skip|rollback on a non-finite loss")
    @argument("--on-spike", default="off", help="off|warn|skip|rollback on a gradient-norm spike")
    @argument(
        "--spike-factor", type=float, default=10.0, metavar="X", help="spike: X times the median"
    )
    @argument("--patience", type=int, default=None, metavar="N", help="early stopping patience")
    @argument("--monitor", default=None, metavar="NAME", help="metric (from log()) to watch")
    @argument("--mode", default="min", help="min|max: which way --monitor improves")
    @argument("--display", default="auto", help="auto|widget|text|off (auto: widget in a notebook)")
    @argument(
        "--tensorboard",
        default="auto",
        help="auto|on|off: event files under runs/tensorboard/ (auto: when tensorboard is installed)",
    )
    @argument(
        "--show", action="store_true", help="print the code that would run, and do not run it"
    )
    @cell_magic
    def train(self, line: str, cell: str) -> None:
        """Run an ordinary PyTorch training loop with mixed precision, prefetching and step timing."""
        __tracebackhide__ = True
        from .cell import register_cell, traceback_from_cell
        from .rewrite import rewrite_cell
        from .runner import run_cell, show

        parse_argstring(self.train, line)  # bad options: IPython's UsageError, as usual
        ip = self.shell
        assert ip is not None
        try:
            # The option names of the magic are TrainOptions' field names (dashes for _).
            options = options_from_line(line, ip.user_ns)
        except TrainmateError as exc:
            raise UsageError(f"%%train: {exc}") from None
        source = ip.transform_cell(cell)
        filename = register_cell(ip, cell, source)
        try:
            compile(source, filename, "exec")
        except SyntaxError as exc:
            raise CellSyntaxError(exc, ip.SyntaxTB.structured_traceback) from None
        result = rewrite_cell(source, ip.user_ns)
        if options.show:
            print(show(result))
            return
        try:
            run_cell(source, filename, options, ip.user_ns, result)
        except TrainmateError as exc:
            raise UsageError(f"%%train: {exc}") from None
        except BaseException as exc:
            traceback_from_cell(exc, filename, ip)
            raise


def options_from_line(line: str, namespace: dict[str, object]) -> TrainOptions:
    """`%%train`'s option line as `TrainOptions` (also for `jupyter_trainmate.train()`)."""
    from .runtime.options import TrainOptions

    try:
        args = parse_argstring(TrainmateMagics.train, line)
    except UsageError as exc:
        raise TrainmateError(f"%%train {line}: {exc}") from None
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainOptions)}
    values["checkpoint"] = _checkpoint_dir(args.checkpoint, namespace)
    values["set"] = tuple(args.set)
    return TrainOptions(**values)
