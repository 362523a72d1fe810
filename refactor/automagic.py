"""
IPython's automagic and shell aliases: lines a notebook runs without their `%` or `!`.

With `%automagic` on (IPython's default) a line that starts with a line magic's name runs that
magic (`pip install numpy` is `%pip install numpy`), and the default aliases run the shell
(`ls -la | grep x.pt` is `!ls -la | grep x.pt`). IPython's input transformers, which the read
step uses, leave these lines alone: the kernel's prefilter handles them as the cell runs. A cell
that does not parse as Python has those of its lines that read so given their escape, as the
prefilter would (a first word that is the magic or alias, the rest not an operator or an
assignment), and the read step then treats them as any `%` or `!` line.
"""

from __future__ import annotations

import ast
import re

# Line magics a notebook writes without `%` (IPython's `%automagic`), and IPython's default
# aliases on POSIX (`%alias`): the shell commands it runs without `!`.
MAGICS = frozenset(
    {"pip", "conda", "mamba", "cd", "pwd", "env", "load_ext", "matplotlib", "pylab", "who",
     "whos", "time", "timeit", "reset", "run", "bookmark", "dhist", "pushd", "popd", "history"}
)  # fmt: skip
ALIASES = frozenset(
    {"cat", "cp", "ldir", "lf", "lk", "ll", "ls", "lx", "mkdir", "mv", "rm", "rmdir", "clear"}
)
_LINE = re.compile(r"^([A-Za-z_]\w*)(\s+(.*))?$")
_NOT_A_COMMAND = tuple("!=()<>,+*/%^&|.[:")


def escaped(source: str) -> tuple[str, list[tuple[int, str]]]:
    """`source` with its automagic and alias lines escaped (`%pip ...`, `!ls ...`), and for each
    (line number, the line as escaped). Only top-level lines that do not parse by themselves."""
    lines = source.split("\n")
    found: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        match = _LINE.match(line.rstrip())
        if match is None:
            continue
        word, rest = match.group(1), (match.group(3) or "")
        if word not in MAGICS and word not in ALIASES:
            continue
        if rest.startswith(_NOT_A_COMMAND) or _parses(line):
            continue  # `ls = [...]`, `cd(x)`, `pwd`: Python, as the prefilter leaves them
        escape = "%" if word in MAGICS else "!"
        lines[number - 1] = escape + line
        found.append((number, escape + line.rstrip()))
    return "\n".join(lines), found


def _parses(line: str) -> bool:
    try:
        ast.parse(line)
    except SyntaxError:
        return False
    return True
