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

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from .cut import edit_headers
from .declare import declare
from .mypytypes import Collector, Suggested
from .rejected import Error, checked_by_default, fresh_first
from .rejected import plan_edits as _plan_edits  # a name of this module: the tests replace it
from .typeexpr import ByQualname, add_imports_text, map_params

ROUNDS = 4
READINGS = 3  # of mypy's types, each followed by a round that checks what they added
ERROR = re.compile(
    r"^(?P<path>[^:]+\.py):(?P<line>\d+): error: (?P<text>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)


@dataclass(frozen=True)
class Checked:
    files: dict[str, str]
    result: str  # "clean", "not run: ...", "N errors left"
    no_type_check: tuple[tuple[str, str], ...] = ()  # (module.function, mypy's first reason)
    removed: tuple[str, ...] = ()  # annotations mypy rejected ("module.function(param)")
    untyped: tuple[str, ...] = ()  # methods that set attributes: all their annotations went
    inferred: tuple[str, ...] = ()  # annotations from mypy's inference that it kept
    declared: tuple[str, ...] = ()  # variables annotated as mypy asked ("module:line x: list[Any]")


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


def _mypy(args: list[str], files: Files, collect: Collector | None = None) -> tuple[str, str, int]:
    """`mypy.api.run(args)` (stdout, stderr, exit status) with `files` as mypy's file-system
    cache: what `mypy.main.main` does for these options (no report, no summary, no colour), the
    messages written as it writes them (blocking ones to stderr). `collect` reads the package's
    trees as mypy parses them and the types it gives their expressions (`export_types`, and a
    plugin: mypy's cache depends on neither)."""
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
    options.export_types = collect is not None
    plugins = None
    if collect is not None:
        plugins = [collect.plugin(options)]
        # the bodies of the package's functions without annotations are typed too (mypy's
        # errors there are set aside by `check`, as mypy would not report them otherwise)
        for pattern in (collect.package, collect.package + ".*"):
            options.per_module_options[pattern] = {"check_untyped_defs": True}
        options.build_per_module_cache()
    messages: list[str] = []

    def flush(filename: str | None, new: list[str], serious: bool) -> None:
        messages.extend(new)
        (stderr if serious else stdout).write("".join(m + "\n" for m in new))

    try:
        result = build.build(
            sources, options, None, flush, files.cache, stdout, stderr, extra_plugins=plugins
        )
        result.manager.metastore.close()
        if collect is not None:
            collect.built(result)
    except CompileError:
        return stdout.getvalue(), stderr.getvalue(), 2
    except SystemExit as exit:  # mypy's internal error ends so (`mypy.api.run` catches it too)
        return stdout.getvalue(), stderr.getvalue(), exit.code if isinstance(exit.code, int) else 2
    notes = sum(": note:" in m for m in messages)
    return stdout.getvalue(), stderr.getvalue(), 1 if messages and notes < len(messages) else 0


def run_mypy(
    folder: Path,
    package: str,
    files: Files | None = None,
    collect: Collector | None = None,
) -> list[Error] | str:
    """mypy's errors on `folder/package`, or a line saying why it could not run.

    mypy runs in this process: the refactor's later rounds then skip the interpreter's start
    and mypy's imports, its in-memory caches are warm (a round on an unchanged module costs a
    fraction of the first), and with `files` kept over the rounds so is its view of the files."""
    target = str(folder / package)
    args = ["--ignore-missing-imports", "--cache-dir", cache_dir(), "--config-file", os.devnull,
            "--no-error-summary", "--show-error-codes", "--no-pretty", "--hide-error-context",
            "--no-color-output", "--allow-redefinition", "--follow-imports", "silent", target]  # fmt: skip
    # mypy looks for modules in the working folder first: a folder there named as a package
    # the notebook imports (a stray `gym/` in the folder the command runs from) would hide
    # that package, and the result would depend on where the refactor runs. In `folder` it
    # finds the package it checks and nothing else.
    with contextlib.chdir(folder):
        try:
            files = files if files is not None else Files()
            files.forget(folder)
            stdout, stderr, status = _mypy(args, files, collect)
        except (ImportError, AttributeError, TypeError):
            # `_mypy` calls mypy's own functions, which are not its public API: a mypy whose
            # signatures moved still checks, through `mypy.api.run` (a fresh file record each
            # round)
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
            errors.append(Error(module, int(found["line"]), found["text"], found["code"] or ""))
    return errors


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

        node = updated_node.with_changes(
            params=map_params(updated_node.params, plain),
            returns=None if "return" in drop else updated_node.returns,
        )
        if name in self.decorate:
            # innermost, on the function itself: `no_type_check` over `@property` (or any
            # object that takes no attributes) raises AttributeError when the class is built
            decorator = cst.Decorator(cst.Name("no_type_check"))
            node = node.with_changes(decorators=[*node.decorators, decorator])
        return node


Write = Callable[[dict[str, str], dict[str, Any]], dict[str, str]]


def check(
    files: dict[str, str],
    package: str,
    added: Mapping[str, object],
    write: Write | None = None,
) -> Checked:
    """mypy on the package in `files`; `added` has the keys (`.mod.fn`) of what we annotated.

    With `write` (which writes signatures, by key, into files), the types mypy inferred on
    the clean package go in where nothing else typed a parameter or a return (`mypytypes`),
    and the rounds after it check them like the others."""
    if importlib.util.find_spec("mypy") is None:
        return Checked(files, "not run: mypy is not installed")
    files = dict(files)
    ours = dict(added)
    decorated: dict[str, str] = {}
    removed: list[str] = []
    untyped: list[str] = []
    inferred: list[str] = []
    declared: list[str] = []
    result = "clean"
    with _cache_lock(), tempfile.TemporaryDirectory(prefix="trainmate-mypy-") as tmp:
        folder = Path(tmp)
        seen = Files()
        written: dict[str, str] = {}
        # Each round's rewritten modules get a time a whole second past the last round's: mypy
        # reads a module again only when its size or its time in whole seconds changed, and
        # an edit can keep the size (removed annotations against an added decorator).
        stamp = int(time.time()) + 1
        # mypy types the expressions only of modules it checks, not of those it takes from its
        # cache (the same package refactored before): a line of this check's own makes every
        # module new to the cache, the same line in every round
        tail = f"\n# trainmate {os.getpid()} {time.time_ns()}\n" if write is not None else ""
        rounds = ROUNDS
        round_ = asked = 0
        collect = Collector(package) if write is not None else None
        fresh: dict[str, set[str]] = {}  # what the last reading added, by function key
        while round_ < rounds:
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
                    (folder / path).write_text(code + tail, encoding="utf-8")
                    os.utime(folder / path, (stamp + round_, stamp + round_))
            errors = run_mypy(folder, package, seen, collect)
            if isinstance(errors, str):
                return Checked(files, errors)
            if collect is not None:
                errors = checked_by_default(errors, files, package)
            result = f"{len(errors)} errors left" if errors else "clean"
            # a variable mypy asks the type of gets it, so its function stays checked
            answered = declare(files, package, errors)
            declared += answered.declared
            # an error in a function that mypy's last reading annotated: those annotations go
            # (both find functions by the errors' lines: in the code mypy checked)
            edits, rest = fresh_first(answered.rest, files, package, fresh, removed)
            planned = (
                _plan_edits(files, package, rest, ours, decorated, removed, untyped) if rest else {}
            )
            files = answered.files  # the edits below find functions by name
            for module, (drop, decorate) in planned.items():
                into = edits.setdefault(module, ({}, set()))
                for qualname, names in drop.items():
                    into[0].setdefault(qualname, set()).update(names)
                into[1].update(decorate)
            for module, (drop, decorate) in edits.items():
                path = f"{package}/{module}.py"
                code = _edited(files[path], drop, decorate)
                if decorate and not re.search(
                    r"^from typing import .*\bno_type_check\b", code, re.M
                ):
                    code = _import_no_type_check(code)
                files[path] = code
            # mypy's types are read from a clean package only (what an annotation it rejected
            # made of its callers is gone with it), READINGS times at most: a section's
            # outputs typed the first time type the next section's parameters the second, and
            # the helpers it passes them to the third
            more: dict[str, Suggested] = {}
            if collect is not None and write is not None and not errors and asked < READINGS:
                asked += 1
                more = collect.suggest(files, decorated, removed, ours)
            if more and write is not None:
                fresh = {}
                refined: dict[str, dict[str, set[str]]] = {}  # by module: the old ones out first
                for key, sig in more.items():
                    old = ours.get(key)
                    module, _, qualname = key[1:].partition(".")
                    had_return = getattr(old, "returns", None) is not None
                    if sig.returns is not None and had_return:
                        refined.setdefault(module, {})[qualname] = {"return"}
                    fresh[key] = set(sig.params) | (
                        {"return"} if sig.returns is not None and not had_return else set()
                    )
                    params = {**getattr(old, "params", {}), **sig.params}
                    ours[key] = Suggested(params, sig.returns or getattr(old, "returns", None))
                    inferred += [f"{module}.{qualname}({n})" for n in sorted(sig.params)]
                    inferred += [f"{module}.{qualname}(return)"] * (sig.returns is not None)
                for module, drop in refined.items():  # one edit of each module
                    path = f"{package}/{module}.py"
                    files[path] = _edited(files[path], drop, set())
                files = write(files, more)
                rounds += 1  # one round more to check them
            if not edits and not more and not answered.declared:
                break
            round_ += 1
    return Checked(
        files,
        result,
        tuple(sorted(decorated.items())),
        tuple(removed),
        tuple(sorted(untyped)),
        tuple(sorted(set(inferred) - set(removed))),
        tuple(declared),
    )


def _edited(code: str, drop: Mapping[str, set[str]], decorate: set[str]) -> str:
    """`code` with `_Edit(drop, decorate)` applied (only the signatures it changes are parsed)."""
    return edit_headers(code, set(drop) | decorate, lambda: _Edit(drop, decorate))


def _import_no_type_check(code: str) -> str:
    """`add_imports(tree, {"from typing import no_type_check"}, guarded=False)`, on the text."""
    return add_imports_text(code, {"from typing import no_type_check"}, guarded=False)
