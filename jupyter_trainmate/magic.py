"""IPython magics of jupyter_trainmate: argument parsing and wiring only."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class


@magics_class
class TrainmateMagics(Magics):
    """`%trainmate doctor [--json] [--data PATH]`: the pre-flight checks, in the notebook."""

    @line_magic
    def trainmate(self, line: str) -> None:
        """Run a trainmate command in the kernel, e.g. `%trainmate doctor --json`."""
        from .cli import build_parser
        from .errors import TrainmateError

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
