"""
Step 1: read the notebook and turn every IPython-only line into Python or a note.

nbformat reads any version (older ones are upgraded to v4); outputs are ignored. IPython's own
`TransformerManager` (the one the kernel uses) classifies magics and shell lines, so a `%` that
continues a `%`-formatting expression is never mistaken for a magic; its output, plain Python with
`get_ipython().run_line_magic(...)`, `.system(...)`, `.getoutput(...)` and
`.run_cell_magic(...)` calls, is then rewritten with libcst:

| notebook | package |
| --- | --- |
| `!pip install x`, `%pip install x`, `%conda install x` | dependency `x` (pyproject), line dropped |
| `%matplotlib`, `%load_ext`, `%autoreload`, `%watermark`, `%config`, help (`obj?`) ... | dropped |
| `%time stmt`, `%timeit stmt`, `%%time`, `%%timeit`, `%%capture` | the statement / body kept |
| `%%writefile [-a] path` | `path` emitted into the package (a `.py` with the notebook's imports it reads) |
| `%run -i path`, `%run path` of a `.py` the notebook wrote above | the file's code as written then, in place of the line (the file itself is not emitted when it reads the notebook's variables and nothing imports it) |
| `x = !cmd` | `subprocess.run(...)` lines, with a warning |
| `%%train OPTIONS` | a training function run by jupyter_trainmate's runtime |
| anything else (`!wget`, `%cd`, `%%bash`, ...) | commented out, reported |
| `pip install x`, `ls -la` with no `%`/`!` (automagic, aliases) in a cell that does not parse | as `%pip install x`, `!ls -la` (`automagic`) |
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shlex
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import nbformat
from IPython.core.inputtransformer2 import TransformerManager
from libcst.metadata import PositionProvider
from nbformat.warnings import MissingIDFieldWarning

from jupyter_trainmate.errors import TrainmateError

from .automagic import escaped
from .globalnames import lines_of

DROPPED_LINE_MAGICS = frozenset(
    [
        "matplotlib",
        "load_ext",
        "reload_ext",
        "unload_ext",
        "autoreload",
        "aimport",
        "watermark",
        "config",
        "pylab",
        "precision",
        "xmode",
        "pinfo",
        "pinfo2",
        "psearch",
        "pdoc",
        "pdef",
        "psource",
        "pfile",
        "who",
        "whos",
        "who_ls",
        "lsmagic",
        "magic",
        "history",
        "recall",
        "rerun",
        "doctest_mode",
        "colors",
        "automagic",
        "autocall",
        "notebook",
        "qtconsole",
        "load_ext",
        "tensorboard",
        "reset",
        "reset_selective",
        "alias_magic",
        "env_list",
        "pprint",
        "autosave",
    ]
)
KEPT_LINE_MAGICS = frozenset({"time", "timeit", "prun", "capture"})
KEPT_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
PIP_COMMANDS = ("pip", "pip3", "python -m pip", "python3 -m pip", "conda", "mamba")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
NBDEV = re.compile(r"^\s*#\s*\|\s*(export|exports|exporti|default_exp)\b\s*(\S*)", re.MULTILINE)


@dataclass(frozen=True)
class Note:
    """Something the report lists: where (cell, line) and what happened."""

    cell: int
    line: int | None
    kind: str  # dependency | dropped | kept | commented | file | warning | skipped | redefined
    text: str

    def where(self) -> str:
        return f"cell {self.cell}" + (f", line {self.line}" if self.line else "")


@dataclass
class CodeCell:
    number: int  # 1-based position in the notebook (markdown and raw cells count too)
    source: str  # as written
    python: str  # magics turned into Python (see the module docstring)
    tags: tuple[str, ...] = ()
    heading: str | None = None  # the last markdown heading above the cell
    markdown: str | None = None  # the markdown cell right above, if any
    train_options: str | None = None  # a %%train cell: its option line
    export: bool | None = None  # nbdev: True with `#| export`
    default_exp: str | None = None  # nbdev: `#| default_exp NAME` seen in or above this cell
    # each `%run` inlined: (the line of `python` its code starts on, the lines it added)
    inlined: tuple[tuple[int, int], ...] = ()

    def source_line(self, line: int) -> int:
        """The cell's own line for line `line` of `python`: an inlined `%run`'s code is on the
        line of the `%run`, and what follows it moves back up by the lines it added."""
        shift = 0
        for start, added in self.inlined:
            if line < start:
                break
            if line <= start + added:
                return start - shift
            shift += added
        return line - shift


@dataclass
class Notebook:
    path: Path
    cells: list[CodeCell]
    headings: list[tuple[int, str]] = field(default_factory=list)  # (cell, text), level 1-2
    title: str | None = None
    dependencies: dict[str, str] = field(default_factory=dict)  # requirement -> where seen
    files: dict[str, str] = field(default_factory=dict)  # %%writefile path -> content
    inlined: dict[str, int] = field(default_factory=dict)  # path -> first cell `%run` inlined it
    notes: list[Note] = field(default_factory=list)
    uses_nbdev: bool = False


def read(path: Path) -> Notebook:
    """Read `path`; a file that is missing, not JSON or not a notebook is a one-line error."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainmateError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TrainmateError(f"{path}: is a folder, not a notebook") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainmateError(f"{path}: cannot read it ({exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrainmateError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(raw, dict) or "nbformat" not in raw:
        raise TrainmateError(f"{path}: not a notebook (no nbformat field)")
    try:
        nb = quietly_parsed(text)
    except Exception as exc:  # nbformat raises several kinds for malformed notebooks
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrainmateError(f"{path}: not a valid notebook ({first[:160]})") from None
    return _cells(path, nb)


def quietly_parsed(text: str) -> nbformat.NotebookNode:
    """The notebook in `text` as nbformat 4, cell ids filled in memory, without nbformat's noise.

    Notebooks of format 4.5 or later whose cells have no ids (many tools drop them) make nbformat
    warn with a `MissingIDFieldWarning` line while its validation gives them ids, as it intends
    to; the ids are ours to fill, so the warning is not the user's business. The file is never
    written.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingIDFieldWarning)
        nb: nbformat.NotebookNode = nbformat.reads(text, as_version=4)  # type: ignore[no-untyped-call]
    return nb


def _cells(path: Path, nb: nbformat.NotebookNode) -> Notebook:
    out = Notebook(path, [])
    heading: str | None = None
    markdown: str | None = None
    default_exp: str | None = None
    manager = TransformerManager()  # type: ignore[no-untyped-call]
    for number, cell in enumerate(nb.cells, start=1):
        source = cell.get("source", "")
        if isinstance(source, list):  # tolerated by some writers
            source = "".join(source)
        if cell.cell_type == "markdown":
            found = HEADING.findall(source)
            if found:
                heading = found[-1][1].strip()
                for level, text in found:
                    if len(level) <= 2:
                        out.headings.append((number, text.strip()))
                    if len(level) == 1 and out.title is None:
                        out.title = text.strip()
            markdown = source
            continue
        if cell.cell_type != "code" or not source.strip():
            markdown = None if cell.cell_type == "code" else markdown
            continue
        tags = tuple(str(t) for t in cell.get("metadata", {}).get("tags", []))
        export: bool | None = None
        for kind, name in NBDEV.findall(source):
            out.uses_nbdev = True
            if kind == "default_exp":
                default_exp = name or default_exp
            else:
                export = True
        code = CodeCell(number, source, "", tags, heading, markdown, None, export, default_exp)
        code.python = _python(code, source, manager, out)
        out.cells.append(code)
        markdown = None
    return out


def _python(cell: CodeCell, source: str, manager: TransformerManager, nb: Notebook) -> str:
    """The cell as Python: cell magics resolved, then line magics and shell lines."""
    stripped = source.lstrip()
    if stripped.startswith("%%"):
        first, _, body = stripped.partition("\n")
        name, _, line = first[2:].partition(" ")
        name, line = name.strip(), line.strip()
        if name in KEPT_CELL_MAGICS:
            nb.notes.append(Note(cell.number, 1, "kept", f"%%{name}: the body is kept"))
            return "\n" + _body(cell, body, manager, nb)  # keeps the line numbers
        if name == "train":
            cell.train_options = line
            return "\n" + _body(cell, body, manager, nb)
        if name == "writefile":
            _writefile(cell, line, body, nb)
            return ""
        nb.notes.append(
            Note(cell.number, 1, "commented", f"%%{name}: cell magic not converted (commented out)")
        )
        return "".join(f"# {line}\n" for line in source.splitlines())
    try:
        python = transform_cell(manager, source)
    except SyntaxError:
        return source  # the parse step reports it with its line
    if not _compiles(python):
        # `pip install x`, `ls -la | grep y`: lines IPython's prefilter escapes as the cell runs
        source, found = escaped(source)
        if found:
            python = transform_cell(manager, source)
            for number, line in found:
                nb.notes.append(
                    Note(cell.number, number, "kept", f"`{line[1:]}` read as `{line}` (automagic)")
                )
    if "get_ipython()" not in python:
        return python
    try:
        module = cst.parse_module(python)
    except cst.ParserSyntaxError:
        return python
    wrapper = cst.MetadataWrapper(module)
    return wrapper.visit(_Magics(cell, nb)).code


def _body(cell: CodeCell, body: str, manager: TransformerManager, nb: Notebook) -> str:
    """`_python` of a cell magic's body, which starts on the cell's second line."""
    before, noted = len(cell.inlined), len(nb.notes)
    python = _python(cell, body, manager, nb)
    moved = tuple((start + 1, added) for start, added in cell.inlined[before:])
    cell.inlined = cell.inlined[:before] + moved
    for index in range(noted, len(nb.notes)):  # what the body's lines said, on the cell's lines
        note = nb.notes[index]
        nb.notes[index] = dataclasses.replace(note, line=note.line + 1) if note.line else note
    return python


def _compiles(python: str) -> bool:
    try:
        compile(python, "<cell>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def transform_cell(manager: TransformerManager, source: str) -> str:
    """`manager.transform_cell(source)`, without its token transforms when the cell, cleaned up
    (leading blank lines, common indentation, prompts), already parses as Python: they only
    change what Python cannot parse (`%magic`, `!shell`, `x = %time f()`, `obj?`), and
    tokenizing every line for them was most of reading a notebook (0.46 s of 0.83 on 500 real
    cells). `tests/test_refactor_read_fast.py` compares the two on every cell of our notebooks."""
    cell = source if source.endswith("\n") else source + "\n"
    lines = cell.splitlines(keepends=True)
    cleanups: list[Callable[[list[str]], list[str]]] = [
        *manager.cleanup_transforms,  # type: ignore[list-item]
        *manager.line_transforms,
    ]
    for transform in cleanups:
        lines = transform(lines)
    text = "".join(lines)
    return text if _compiles(text) else manager.transform_cell(source)


def _writefile(cell: CodeCell, line: str, body: str, nb: Notebook) -> None:
    args = shlex.split(line)
    append = any(a in ("-a", "--append") for a in args)
    names = [a for a in args if not a.startswith("-")]
    if len(names) != 1 or Path(names[0]).is_absolute() or ".." in Path(names[0]).parts:
        nb.notes.append(
            Note(cell.number, 1, "commented", f"%%writefile {line}: not a relative path; skipped")
        )
        return
    target = Path(names[0]).as_posix()
    if body and not body.endswith("\n"):
        body += "\n"  # as IPython passes a cell magic its body
    nb.files[target] = (nb.files.get(target, "") if append else "") + body
    nb.notes.append(
        Note(cell.number, 1, "file", f"%%writefile {target}: into the package (or, if only `%run` "
             "runs it, its code where it runs)")
    )  # fmt: skip


def _literal(node: cst.BaseExpression) -> str | None:
    try:
        value = ast.literal_eval(cst.Module([]).code_for_node(node))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def _ipython_call(node: cst.BaseExpression) -> tuple[str, list[str]] | None:
    """`get_ipython().METHOD('a', 'b')` -> (METHOD, ['a', 'b'])."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
        return None
    owner = node.func.value
    if not (
        isinstance(owner, cst.Call)
        and isinstance(owner.func, cst.Name)
        and owner.func.value == "get_ipython"
    ):
        return None
    args = [_literal(a.value) for a in node.args]
    if any(a is None for a in args):
        return None
    return node.func.attr.value, [a for a in args if a is not None]


# pip's options that take a value (`--trusted-host HOST`, `-f URL`): the value is no requirement.
PIP_VALUE_OPTIONS = frozenset(
    {
        *("-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url"),
        *("-f", "--find-links", "--trusted-host", "-t", "--target", "--prefix", "--root", "--src"),
        *("-e", "--editable", "--no-binary", "--only-binary", "--platform", "--python-version"),
        *("--implementation", "--abi", "--progress-bar", "--timeout", "--retries", "--cache-dir"),
        *("--log", "--proxy", "--exists-action", "--upgrade-strategy", "--cert", "--client-cert"),
        *("-C", "--config-settings", "--global-option"),
    }
)
# A pin to a local version (`torch==1.2.0+cu92`): PyPI accepts no local versions, so it resolves
# only from the index the command named with `-f` / `--index-url`, which a package's
# dependencies cannot carry: the package would not install. The requirement keeps its name.
# The shell's part of a `!pip install` line: a redirection (`&> log`, `2>&1`, `>/dev/null`) and
# what ends the command (`;`, `&&`, `|`): neither is a requirement (`&>` in a package's
# dependencies makes pip refuse to install it).
REDIRECT = re.compile(r"^(\d*|&)(>>?|<)(&\d+)?")
COMMAND_END = ("&&", "||", "|", ";", "&")
LOCAL_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?)\s*===?\s*[^,;]*\+[^,;]*$")


def requirements_from(command: str) -> list[str] | None:
    """The requirements of a `pip install ...` / `conda install ...` command, else None."""
    for prefix in PIP_COMMANDS:
        if command.startswith(prefix + " "):
            rest = command[len(prefix) :].split()
            break
    else:
        return None
    if not rest or rest[0] != "install":
        return None
    found, skip = [], False
    words = shlex.split(" ".join(rest[1:]))
    for at, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word in COMMAND_END:  # `pip install a && pip install b`: b's too
            if word in ("&&", ";"):
                found += requirements_from(shlex.join(words[at + 1 :])) or []
            break
        redirect = REDIRECT.match(word)
        if redirect:
            # `&> log`: the file is the next word; `2>&1` names its target itself
            skip = redirect.end() == len(word) and redirect.group(3) is None
            continue
        if word in PIP_VALUE_OPTIONS:
            skip = True
            continue
        last = word.endswith(";")
        word = word.removesuffix(";")
        if word.startswith("-") or word.startswith(("git+", "http", ".", "/")):
            continue
        local = LOCAL_PIN.match(word)
        found.append(local.group(1) if local else word)
        if last:
            break
    return found


class _Magics(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, cell: CodeCell, nb: Notebook) -> None:
        super().__init__()
        self.cell = cell
        self.nb = nb
        self.needs_subprocess = False

    def _note(self, node: cst.CSTNode, kind: str, text: str) -> None:
        line = self.get_metadata(PositionProvider, node).start.line
        self.nb.notes.append(Note(self.cell.number, line, kind, text))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        if len(updated_node.body) != 1:
            return updated_node
        statement = updated_node.body[0]
        code = cst.Module([]).code_for_node(original_node).strip()
        if isinstance(statement, cst.Expr):
            call = _ipython_call(statement.value)
            if call is not None:
                return self._statement(original_node, call, code)
        if isinstance(statement, cst.Assign):
            call = _ipython_call(statement.value)
            if call is not None and call[0] == "getoutput" and call[1]:
                self._note(original_node, "warning", f"`{code}`: shell output -> subprocess.run")
                self.needs_subprocess = True
                value = cst.parse_expression(
                    f"subprocess.run({call[1][0]!r}, shell=True, check=True, "
                    "capture_output=True, text=True).stdout.splitlines()"
                )
                return updated_node.with_changes(body=[statement.with_changes(value=value)])
        if "get_ipython()" in code:
            self._note(original_node, "commented", f"`{code}`: IPython-only; commented out")
            return _commented(updated_node, code)
        return updated_node

    def _statement(
        self, node: cst.SimpleStatementLine, call: tuple[str, list[str]], code: str
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        method, args = call
        if method == "run_line_magic" and len(args) == 2 and args[0] == "run":
            inlined = self._inlined(node, args[1])
            if inlined is not None:
                return inlined
        if method == "system" and args:
            requirements = requirements_from(args[0].strip())
            if requirements is not None:
                for requirement in requirements:
                    self.nb.dependencies.setdefault(requirement, f"cell {self.cell.number}")
                self._note(node, "dependency", f"`!{args[0]}` -> dependencies {requirements}")
                return _dropped(node)
            self._note(node, "commented", f"`!{args[0]}`: shell command; commented out")
            return _commented(node, f"!{args[0]}")
        if method == "run_line_magic" and len(args) == 2:
            name, line = args
            if name in ("pip", "conda", "mamba"):
                requirements = requirements_from(f"{name} {line}") or []
                for requirement in requirements:
                    self.nb.dependencies.setdefault(requirement, f"cell {self.cell.number}")
                self._note(node, "dependency", f"`%{name} {line}` -> dependencies {requirements}")
                return _dropped(node)
            if name in DROPPED_LINE_MAGICS:
                self._note(node, "dropped", f"`%{name} {line}`".replace(" `", "`"))
                return _dropped(node)
            if name in KEPT_LINE_MAGICS:
                statement = line
                if name == "timeit":  # its options come first: -n 10 -r 3 stmt
                    statement = re.sub(r"^(-\w+(\s+\d+)?\s+)*", "", line)
                try:
                    kept = cst.parse_statement(statement + "\n")
                except cst.ParserSyntaxError:
                    return _commented(node, f"%{name} {line}")
                self._note(node, "kept", f"`%{name}`: the statement is kept")
                return kept.with_changes(leading_lines=node.leading_lines)
        self._note(node, "commented", f"`{_magic_text(method, args)}`: not converted; commented")
        return _commented(node, _magic_text(method, args))

    def _inlined(
        self, node: cst.SimpleStatementLine, line: str
    ) -> cst.FlattenSentinel[cst.BaseStatement] | None:
        """`%run -i path` (or `%run path`) of a Python file the notebook wrote above with
        `%%writefile`: its code, as written then, in place of the line (`-i` runs it in the
        notebook's namespace, as the inlined statements do; a plain `%run` puts what it binds
        there). The book-style notebook keeps its steps in files (`%%writefile
        model_training/v1.py`, then `%run -i model_training/v1.py`): commented out, the
        package's sections skipped the data preparation and the training. The lines after it
        in the cell move down by the file's length. None: another `%run` (other options,
        arguments, a file the notebook did not write), which stays commented out."""
        try:
            args = shlex.split(line)
        except ValueError:
            return None
        paths = [a for a in args if not a.startswith("-")]
        if len(paths) != 1 or {a for a in args if a.startswith("-")} - {"-i"}:
            return None
        target = Path(paths[0]).as_posix()
        code = self.nb.files.get(target) if target.endswith(".py") else None
        try:
            module = cst.parse_module(code) if code else None
        except cst.ParserSyntaxError:
            module = None
        if module is None or not module.body:
            return None
        comment = cst.EmptyLine(comment=cst.Comment(f"# notebook: %run {line} (inlined)"))
        first = module.body[0]
        block = cst.Module([first.with_changes(leading_lines=[comment]), *module.body[1:]]).code
        start = self.get_metadata(PositionProvider, node).start.line
        # where the code starts in the cell's Python: the lines earlier `%run`s added are above
        start += sum(added for _, added in self.cell.inlined)
        self.cell.inlined += ((start, len(lines_of(block)) - 1),)
        first = first.with_changes(leading_lines=[*node.leading_lines, comment])
        self._note(
            node, "kept", f"`%run {line}`: the code of {target}, which the notebook wrote, inlined"
        )
        self.nb.inlined.setdefault(target, self.cell.number)
        return cst.FlattenSentinel([first, *module.body[1:]])


def _magic_text(method: str, args: list[str]) -> str:
    if method == "run_line_magic" and args:
        return f"%{args[0]} {' '.join(args[1:])}".rstrip()
    if method == "system" and args:
        return f"!{args[0]}"
    return f"get_ipython().{method}(...)"


def _dropped(node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """A placeholder the emit step removes (a block can never be left empty)."""
    return node.with_changes(body=[cst.Pass()], trailing_whitespace=_comment("trainmate: dropped"))


def _commented(node: cst.SimpleStatementLine, text: str) -> cst.SimpleStatementLine:
    return node.with_changes(
        body=[cst.Pass()], trailing_whitespace=_comment(f"notebook: {text} (not converted)")
    )


def _comment(text: str) -> cst.TrailingWhitespace:
    text = text.replace("\n", " ")
    return cst.TrailingWhitespace(
        whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(f"# {text}")
    )
