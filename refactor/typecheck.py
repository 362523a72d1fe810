"""
mypy on the annotated package: the annotations it rejects are removed, and a function whose own
code fails gets `@no_type_check` (with mypy's reason, for the report).

mypy runs in this process (`mypy.build`, as `mypy.api.run` would) on a copy of the package's
modules in a temporary folder, with its cache in a folder of the system's temporary directory
kept between refactors (the first run reads torch's stubs, the next ones only the package), and
its record of the file system kept over the rounds. A few rounds at most: the first finds the
errors, the next confirm the package is clean once the rejected annotations are gone.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from .cut import edit_headers
from .typeexpr import ByQualname, add_imports_text

ROUNDS = 4
ERROR = re.compile(
    r"^(?P<path>[^:]+\.py):(?P<line>\d+): error: (?P<text>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)
# errors about a name or attribute (a variable's missing annotation, an attribute whose defining
# function mypy does not check, an undefined name): no parameter's annotation causes them, but
# for an attribute read from a parameter (`sbs.total_epochs`), where the parameter's type counts
NOT_A_PARAMETER = frozenset({"var-annotated", "has-type", "name-defined"})
CALL_CODES = frozenset({"arg-type", "call-arg", "misc"})  # errors of a call's arguments
# the function such an error is about: 'Too many arguments for "train"', 'Argument 3 to "train"
# has ...', '"train" gets multiple values for keyword argument "loss"'
CALLEE = re.compile(r'^"(\w+)" gets multiple values|(?:for|to) "(\w+)"')
HAS_TYPE = re.compile(r'^Cannot determine type of "(\w+)"')
ARGUMENT = re.compile(
    r'^Argument (?:(?P<n>\d+)|"(?P<name>\w+)") to "(?P<fn>\w+)"(?: of "(?P<cls>\w+)")?'
)


@dataclass(frozen=True)
class Checked:
    files: dict[str, str]
    result: str  # "clean", "not run: ...", "N errors left"
    no_type_check: tuple[tuple[str, str], ...] = ()  # (module.function, mypy's first reason)
    removed: tuple[str, ...] = ()  # annotations mypy rejected ("module.function(param)")
    untyped: tuple[str, ...] = ()  # methods that set attributes: all their annotations went


@dataclass(frozen=True)
class _Error:
    module: str
    line: int
    text: str
    code: str


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    """One refactor's mypy rounds at a time on the shared cache folder (a lock file beside it):
    two refactors at once that write packages of the same name changed each other's results
    through mypy's cache entries for that name ("3 errors left" against "clean", seen on the
    corpus; one after the other both are clean and write the same bytes). An OS lock (`flock`):
    a refactor that dies lets go of it. Where the lock file cannot be made or locked (a read-only
    temporary folder), the rounds run unlocked, as before. `filelock` comes with torch."""
    from filelock import FileLock

    lock = FileLock(cache_dir() + ".lock")
    try:
        lock.acquire()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.release()


def cache_dir() -> str:
    import mypy.version

    user = f"-{os.getuid()}" if hasattr(os, "getuid") else ""  # a user's own (and its lock)
    name = f"trainmate-mypy-{mypy.version.__version__}-py{sys.version_info[0]}{sys.version_info[1]}{user}"
    return str(Path(tempfile.gettempdir()) / name)


class Files:
    """mypy's record of the file system (`mypy.fscache.FileSystemCache`: stat, listdir, reads
    and hashes), kept over the rounds of one check: a round then finds torch's and typeshed's
    files, which do not change, without looking at them again (about 0.1-0.2 s a round); the
    package's own files, which the rounds rewrite, are forgotten before each round."""

    def __init__(self) -> None:
        try:
            from mypy.fscache import FileSystemCache
        except ImportError:  # a mypy without it: `run_mypy` falls back to `mypy.api.run`
            self.cache: Any = None
        else:
            self.cache = FileSystemCache()

    def forget(self, folder: Path) -> None:
        prefix = str(folder)
        cache = self.cache
        if cache is None:
            raise ImportError("mypy.fscache")
        for seen in (
            cache.stat_or_none_cache, cache.listdir_cache, cache.listdir_error_cache,
            cache.isfile_case_cache, cache.exists_case_cache, cache.read_cache,
            cache.read_error_cache, cache.hash_cache,
        ):  # fmt: skip
            for path in [path for path in seen if path.startswith(prefix)]:
                del seen[path]
        cache.fake_package_cache = {p for p in cache.fake_package_cache if not p.startswith(prefix)}


def _mypy(args: list[str], files: Files) -> tuple[str, str, int]:
    """`mypy.api.run(args)` (stdout, stderr, exit status) with `files` as mypy's file-system
    cache: what `mypy.main.main` does for these options (no report, no summary, no colour), the
    messages written as it writes them (blocking ones to stderr)."""
    import io

    from mypy import build
    from mypy.errors import CompileError
    from mypy.main import process_options

    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        sources, options = process_options(args, stdout=stdout, stderr=stderr, fscache=files.cache)
    except SystemExit as exit:
        return stdout.getvalue(), stderr.getvalue(), exit.code if isinstance(exit.code, int) else 2
    options.fast_exit = False
    messages: list[str] = []

    def flush(filename: str | None, new: list[str], serious: bool) -> None:
        messages.extend(new)
        (stderr if serious else stdout).write("".join(m + "\n" for m in new))

    try:
        result = build.build(sources, options, None, flush, files.cache, stdout, stderr)
        result.manager.metastore.close()
    except CompileError:
        return stdout.getvalue(), stderr.getvalue(), 2
    except SystemExit as exit:  # mypy's internal error ends so (`mypy.api.run` catches it too)
        return stdout.getvalue(), stderr.getvalue(), exit.code if isinstance(exit.code, int) else 2
    notes = sum(": note:" in m for m in messages)
    return stdout.getvalue(), stderr.getvalue(), 1 if messages and notes < len(messages) else 0


def run_mypy(folder: Path, package: str, files: Files | None = None) -> list[_Error] | str:
    """mypy's errors on `folder/package`, or a line saying why it could not run.

    mypy runs in this process: the refactor's later rounds then skip the interpreter's start
    and mypy's imports, its in-memory caches are warm (a round on an unchanged module costs a
    fraction of the first), and with `files` kept over the rounds so is its view of the files."""
    target = str(folder / package)
    args = ["--ignore-missing-imports", "--cache-dir", cache_dir(), "--config-file", os.devnull,
            "--no-error-summary", "--show-error-codes", "--no-pretty", "--hide-error-context",
            "--no-color-output", "--allow-redefinition", "--follow-imports", "silent", target]  # fmt: skip
    try:
        files = files if files is not None else Files()
        files.forget(folder)
        stdout, stderr, status = _mypy(args, files)
    except (ImportError, AttributeError, TypeError):
        # `_mypy` calls mypy's own functions, which are not its public API: a mypy whose
        # signatures moved still checks, through `mypy.api.run` (a fresh file record each round)
        from mypy import api

        stdout, stderr, status = api.run(args)
    if status not in (0, 1):
        return f"not run: mypy failed ({(stderr or stdout).strip()[:200]})"
    errors = []
    for line in stdout.splitlines():
        found = ERROR.match(line)
        # the path as mypy has it: under `folder`, or where an earlier refactor's copy of an
        # unchanged module was (mypy replays a cached module's errors with its first path)
        parts = Path(found["path"]).parts if found else ()
        if found and package in parts:
            inside = parts[len(parts) - 1 - parts[::-1].index(package) + 1 :]
            module = "/".join(inside)[:-3].replace("/", ".")
            errors.append(_Error(module, int(found["line"]), found["text"], found["code"] or ""))
    return errors


_Function = tuple[str, int, int, ast.FunctionDef | ast.AsyncFunctionDef]


def _functions(code: str) -> list[_Function]:
    """(qualname, first line, last line, node) of the module's functions and methods."""
    found = []
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    for node in tree.body:
        members = [(node, "")] if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else []
        if isinstance(node, ast.ClassDef):
            members = [
                (s, f"{node.name}.")
                for s in node.body
                if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
        for fn, prefix in members:
            first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
            found.append((prefix + fn.name, first, fn.end_lineno or fn.lineno, fn))
    return found


class _Edit(ByQualname):
    """Drop the named annotations, and put `@no_type_check` on the named functions."""

    def __init__(self, drop: Mapping[str, set[str]], decorate: set[str]) -> None:
        super().__init__()
        self.drop, self.decorate = drop, decorate

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        name = self.qualname(updated_node)
        drop = self.drop.get(name, set())

        def plain(p: cst.Param) -> cst.Param:
            return p.with_changes(annotation=None) if p.name.value in drop else p

        params = updated_node.params
        node = updated_node.with_changes(
            params=params.with_changes(
                posonly_params=[plain(p) for p in params.posonly_params],
                params=[plain(p) for p in params.params],
                kwonly_params=[plain(p) for p in params.kwonly_params],
            ),
            returns=None if "return" in drop else updated_node.returns,
        )
        if name in self.decorate:
            # innermost, on the function itself: `no_type_check` over `@property` (or any
            # object that takes no attributes) raises AttributeError when the class is built
            decorator = cst.Decorator(cst.Name("no_type_check"))
            node = node.with_changes(decorators=[*node.decorators, decorator])
        return node


def check(files: dict[str, str], package: str, added: Mapping[str, object]) -> Checked:
    """mypy on the package in `files`; `added` has the keys (`.mod.fn`) of what we annotated."""
    if importlib.util.find_spec("mypy") is None:
        return Checked(files, "not run: mypy is not installed")
    files = dict(files)
    decorated: dict[str, str] = {}
    removed: list[str] = []
    untyped: list[str] = []
    result = "clean"
    with _cache_lock(), tempfile.TemporaryDirectory(prefix="trainmate-mypy-") as tmp:
        folder = Path(tmp)
        seen = Files()
        written: dict[str, str] = {}
        # Each round's rewritten modules get a time a whole second past the last round's: mypy
        # reads a module again only when its size or its time in whole seconds changed, and
        # an edit can keep the size (removed annotations against an added decorator).
        stamp = int(time.time()) + 1
        for round_ in range(ROUNDS):
            for path, code in files.items():
                # only what the last round's edits changed: mypy re-reads and re-hashes a file
                # whose time changed, and rewrites its cache entry
                if (
                    path.startswith(f"{package}/")
                    and path.endswith(".py")
                    and written.get(path) != code
                ):
                    written[path] = code
                    (folder / path).parent.mkdir(parents=True, exist_ok=True)
                    (folder / path).write_text(code, encoding="utf-8")
                    os.utime(folder / path, (stamp + round_, stamp + round_))
            errors = run_mypy(folder, package, seen)
            if isinstance(errors, str):
                return Checked(files, errors)
            if not errors:
                result = "clean"
                break
            result = f"{len(errors)} errors left"
            edits = _plan_edits(files, package, errors, added, decorated, removed, untyped)
            if not edits:
                break
            for module, (drop, decorate) in edits.items():
                path = f"{package}/{module}.py"
                code = _edited(files[path], drop, decorate)
                if decorate and not re.search(
                    r"^from typing import .*\bno_type_check\b", code, re.M
                ):
                    code = _import_no_type_check(code)
                files[path] = code
    return Checked(
        files, result, tuple(sorted(decorated.items())), tuple(removed), tuple(sorted(untyped))
    )


def _edited(code: str, drop: Mapping[str, set[str]], decorate: set[str]) -> str:
    """`code` with `_Edit(drop, decorate)` applied (only the signatures it changes are parsed)."""
    return edit_headers(code, set(drop) | decorate, lambda: _Edit(drop, decorate))


def _import_no_type_check(code: str) -> str:
    """`add_imports(tree, {"from typing import no_type_check"}, guarded=False)`, on the text."""
    return add_imports_text(code, {"from typing import no_type_check"}, guarded=False)


def _plan_edits(
    files: dict[str, str],
    package: str,
    errors: list[_Error],
    added: Mapping[str, object],
    decorated: dict[str, str],
    removed: list[str],
    untyped: list[str],
) -> dict[str, tuple[dict[str, set[str]], set[str]]]:
    """For each module: annotations to drop (by function) and functions to decorate (and, in
    `untyped`, the methods left without annotations instead)."""
    edits: dict[str, tuple[dict[str, set[str]], set[str]]] = {}
    ours = {key: getattr(sig, "params", {}) for key, sig in added.items()}
    returns = {key for key, sig in added.items() if getattr(sig, "returns", None) is not None}
    by_name: dict[str, list[str]] = {}
    for key in ours:
        by_name.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    parsed: dict[str, tuple[list[_Function], list[str]]] = {}  # each module parsed once a round
    for error in errors:
        if error.module not in parsed:
            code = files.get(f"{package}/{error.module}.py", "")
            parsed[error.module] = (_functions(code), code.splitlines())
        functions, lines = parsed[error.module]
        where = next(((q, fn) for q, a, b, fn in functions if a <= error.line <= b), None)
        line = lines[error.line - 1] if 0 < error.line <= len(lines) else ""
        dropped = False
        argument = ARGUMENT.match(error.text)
        about = CALLEE.search(error.text) if error.code in CALL_CODES else None
        callee = (about[1] or about[2]) if about is not None else None
        unpacked = where is not None and callee is not None and _unpacks(where[1], error, callee)
        if argument and error.code == "arg-type" and not unpacked:
            for key in by_name.get(argument["fn"], []):
                if argument["cls"] and not key.endswith(f"{argument['cls']}.{argument['fn']}"):
                    continue
                dropped |= _drop(edits, key, set(ours[key]), removed)
        if where is None or dropped:
            continue
        qualname, fn = where
        key = f".{error.module}.{qualname}"
        if key[1:] in untyped:
            continue  # mypy does not check it any more
        mine = set(ours.get(key, {}))
        if unpacked:
            # the call it names unpacks a sequence (`train(net, *data, epochs)`): once mypy does
            # not know the sequence's length (an annotation of ours dropped, Dive into DL 3.16)
            # it maps the later arguments onto parameters by guesswork ("Too many arguments", an
            # argument checked against the wrong parameter), and dropping the callee's
            # annotations only hides that; the call is this function's own code, which is
            # decorated (or left unannotated, below)
            pass
        elif error.code in ("return-value", "return") and key in returns:
            dropped = _drop(edits, key, {"return"}, removed)
        elif error.line == fn.lineno or error.line <= (fn.body[0].lineno - 1):
            dropped = _drop(edits, key, mine | ({"return"} if key in returns else set()), removed)
        else:
            named = {p for p in mine if re.search(rf"\b{re.escape(p)}\b", line)}
            kept = {
                n
                for n in _annotated(fn) - named
                if f"{error.module}.{qualname}({n})" not in removed
            }
            if error.code in NOT_A_PARAMETER and kept and not _read_from(named, error, line):
                # a parameter's type is not what these errors are about: dropping the ones named
                # on the line only ends them by leaving mypy a function without annotations
                # (which it does not check); else the next round shows the same error and the
                # function is decorated then, one round later and with annotations lost
                named = set()
            dropped = _drop(edits, key, named, removed)
        every = _annotated(fn)
        if (
            not dropped
            and "." in qualname
            and every
            and every <= mine | ({"return"} if key in returns else set())
            and _sets_attributes(fn)
        ):
            # a method that sets attributes on `self`, all of whose annotations are ours:
            # decorated, it would leave those attributes without a type for every other method
            # that reads them (mypy's "Cannot determine type", one round later, and each of those
            # decorated in turn); without annotations mypy does not check it, its attributes are
            # Any, and the other methods keep being checked
            dropped = _drop(edits, key, every, removed)
            untyped.append(key[1:])
        if not dropped and f"{error.module}.{qualname}" not in decorated:
            decorated[f"{error.module}.{qualname}"] = f"{error.text} (line {error.line})"
            edits.setdefault(error.module, ({}, set()))[1].add(qualname)
    return edits


def _read_from(params: set[str], error: _Error, line: str) -> bool:
    """Whether `error` is mypy's "Cannot determine type" of an attribute `line` reads from one of
    `params` (`sbs.total_epochs`): mypy looks it up in the parameter's annotated type, and
    without the annotation (Any) the error ends."""
    name = HAS_TYPE.match(error.text) if error.code == "has-type" else None
    return name is not None and any(
        re.search(rf"\b{re.escape(p)}\s*\.\s*{re.escape(name[1])}\b", line) for p in params
    )


def _unpacks(fn: ast.FunctionDef | ast.AsyncFunctionDef, error: _Error, callee: str) -> bool:
    """Whether the call of `callee` that `error` is about (on its line in `fn`) unpacks a
    sequence into its arguments (`*args`)."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        if not node.lineno <= error.line <= (node.end_lineno or node.lineno):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name == callee and any(isinstance(a, ast.Starred) for a in node.args):
            return True
    return False


def _sets_attributes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the method assigns an attribute of its first parameter (`self.items = ...`)."""
    args = [*fn.args.posonlyargs, *fn.args.args]
    if not args:
        return False
    first = args[0].arg
    for node in ast.walk(fn):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == first
                    and isinstance(part.ctx, ast.Store)
                ):
                    return True
    return False


def _annotated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names of `fn`'s annotated parameters, and "return" if its return is annotated."""
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {p.arg for p in params if p is not None and p.annotation is not None}
    return names | ({"return"} if fn.returns is not None else set())


def _drop(
    edits: dict[str, tuple[dict[str, set[str]], set[str]]],
    key: str,
    names: set[str],
    removed: list[str],
) -> bool:
    """Drop our annotations `names` of function `key` (`.mod.fn`); False if none was left."""
    module, _, qualname = key[1:].partition(".")
    new = {n for n in names if f"{module}.{qualname}({n})" not in removed}
    if not new:
        return False
    edits.setdefault(module, ({}, set()))[0].setdefault(qualname, set()).update(new)
    removed += [f"{module}.{qualname}({n})" for n in sorted(new)]
    return True
