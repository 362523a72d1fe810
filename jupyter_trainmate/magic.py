"""IPython magics of jupyter_trainmate: argument parsing and wiring only."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from .errors import TrainmateError


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
        assert self.shell is not None
        parser.set_defaults(user_ns=self.shell.user_ns)  # export/bench name notebook objects
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

    @cell_magic
    def train(self, line: str, cell: str) -> None:
        # The docstring (`%%train?`) is the parser's help: see below the class.
        __tracebackhide__ = True
        from .cell import register_cell, traceback_from_cell, transformed
        from .rewrite import compile_rewritten
        from .runner import rewrite_for, run_cell, show
        from .runtime.notebook import notebook_path
        from .runtime.options import HelpShown, parse_options

        ip = self.shell
        assert ip is not None
        notebook = notebook_path(ip.user_ns)
        try:
            options = parse_options(line, Path(notebook).parent if notebook else None)
        except HelpShown:
            return
        except TrainmateError as exc:
            raise UsageError(f"%%train: {exc}") from None
        source = transformed(ip, cell)
        filename = register_cell(ip, cell, source)
        try:  # the cell as it is (compiled once per source: a re-run reuses it)
            compile_rewritten(source, source, filename)
        except SyntaxError as exc:
            raise CellSyntaxError(exc, ip.SyntaxTB.structured_traceback) from None
        result = rewrite_for(source, ip.user_ns, options)
        if options.show:
            print(show(result))
            return
        try:
            if options.procs is not None and options.sweep is not None:
                raise TrainmateError("--procs and --sweep together: not supported yet; use one")
            if options.procs is not None:  # data-parallel in worker processes
                from .distributed.launch import run_procs

                run_procs(source, filename, options, ip.user_ns, result)
            elif options.sweep is not None:
                from .sweep.driver import run_sweep
                from .sweep.parallel import run_parallel

                run_sweep(source, filename, options, ip.user_ns, result, run_parallel)
            else:
                run_cell(source, filename, options, ip.user_ns, result)
        except TrainmateError as exc:
            raise UsageError(f"%%train: {exc}") from None
        except BaseException as exc:
            traceback_from_cell(exc, filename, ip)
            raise


def _train_doc() -> str:
    from .runtime.options import build_parser

    return (
        "Run an ordinary PyTorch training loop with mixed precision, prefetching and step timing."
        "\n\n" + build_parser().format_help()
    )


TrainmateMagics.train.__doc__ = _train_doc()
