"""`trainmate refactor` on a folder of real notebooks: is every package it writes correct, and
how far is the notebook's script turned into named, typed, tested functions?

    python benchmarks/refactor_corpus.py CORPUS_DIR [--out DIR] [--jobs N] [--json FILE]
        [--extra-path DIR]

The notebooks are others' code and stay outside the repository: `benchmarks/refactor_corpus.toml`
lists the ones measured in BENCHMARKS.md (repository, path, commit). For each notebook the
script runs the command as a user does (`trainmate refactor NB -o OUT/<name> --no-docs`, static:
no `--execute`; when it refuses a cell that does not parse it runs again with
`--skip-bad-cells`) and then reads only what the command wrote, so it keeps working while the
refactor's internals change:

- exit: the command's exit status, and its last stderr line when it failed;
- gate: `ruff check --select E9,F63,F7,F82,F811` on the written files, split into errors the
  notebook's own code has (the same gate on the notebook as IPython runs it: every code cell
  through IPython's `TransformerManager`, concatenated) and errors the refactor introduced;
- import: every module of the package in a fresh interpreter (an empty temporary working
  folder, PYTHONPATH = the output folder): ok, a third-party package missing, or a real failure
  (NameError, SyntaxError, an error of the package's own); importing must print nothing and
  write no files;
- run: the share of the package's code lines (not blank, not comments, not docstrings) inside
  the body of `run()`;
- typed: the share of parameters (not self/cls) and returns annotated, over all functions;
  both over the modules made from the notebook: the modules written from templates
  (`__main__.py`, `distributed.py`, the same in every package and fully annotated) are left out,
  or they would raise every package's figure by the same fixed amount;
- tests: the generated test functions and whether `pytest -q -x` passes in the output folder;
- versions kept and refused cells, as REFACTOR_REPORT.md states them (0 where it does not).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tokenize
import warnings
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

GATE = "E9,F63,F7,F82,F811"
RUFF = [sys.executable, "-m", "ruff", "check", "--select", GATE + ",F405", "--no-cache"]
RUFF += ["--isolated"]
# Names IPython puts in a notebook's namespace: the notebook's own script may use them.
CODE_CELL_MAGICS = {"%%time", "%%timeit", "%%capture", "%%prun", "%%train"}
IPYTHON_HEADER = "from IPython import get_ipython\nfrom IPython.display import display\n"
CHILD = r"""
import contextlib, importlib, io, json, os, sys, traceback
result_file, package, *modules = sys.argv[1:]
results = []
for module in modules:
    result = {"module": module, "status": "ok"}
    before = set(os.listdir("."))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            importlib.import_module(module)
    except BaseException as exc:
        name = getattr(exc, "name", None) or ""
        top = name.split(".")[0]
        where = ""
        for frame in traceback.extract_tb(exc.__traceback__):
            if "/" + package + "/" in frame.filename.replace("\\", "/"):
                where = f"{frame.filename.rsplit(package + '/', 1)[-1]}:{frame.lineno}: {frame.line}"
        if type(exc) is ModuleNotFoundError and top and top != package:
            result.update(status="missing", detail=top)
        else:
            message = str(exc).splitlines()[0] if str(exc) else ""
            error = f"{type(exc).__name__}: {message}"
            result.update(status="failed", detail=" at ".join(x for x in (error, where) if x))
    result["printed"] = out.getvalue().strip()
    result["wrote"] = sorted(set(os.listdir(".")) - before)
    results.append(result)
    with open(result_file, "w") as f:
        json.dump(results, f)
"""


@dataclass
class ModuleImport:
    module: str
    status: str  # ok, missing, failed, timeout
    detail: str = ""
    printed: str = ""
    wrote: list[str] = field(default_factory=list)


@dataclass
class Result:
    notebook: str
    cells: int = 0
    lines: int = 0
    exit: int = 0
    error: str = ""
    skip_bad_cells: bool = False
    seconds: float = 0.0
    gate_introduced: list[str] = field(default_factory=list)
    gate_preexisting: list[str] = field(default_factory=list)
    imports: list[ModuleImport] = field(default_factory=list)
    run_lines: int = 0
    code_lines: int = 0
    annotated: int = 0
    annotatable: int = 0
    tests: int = 0
    tests_passed: bool | None = None
    tests_output: str = ""
    tests_missing: str = ""
    versions: int = 0
    refused: int = 0
    report_gate: str = ""

    @property
    def written(self) -> bool:
        return self.exit == 0

    @property
    def run_share(self) -> float | None:
        return self.run_lines / self.code_lines if self.code_lines else None

    @property
    def typed_share(self) -> float | None:
        return self.annotated / self.annotatable if self.annotatable else None

    def import_counts(self) -> Counter[str]:
        return Counter(m.status for m in self.imports)

    def import_dirty(self) -> list[ModuleImport]:
        return [m for m in self.imports if m.printed or m.wrote]


# ---------------------------------------------------------------- the notebook's own script


def notebook_cells(path: Path) -> list[str]:
    import nbformat

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def notebook_script(cells: Iterable[str]) -> tuple[str, int]:
    """The cells as IPython would run them, one script; cells that still do not parse are left
    out (ruff stops at the first syntax error) and counted. The body of a cell magic that runs
    it in the notebook's namespace (`%%time`, `%%capture`, `%%train`...) is kept as code, as it
    runs, instead of the string IPython hands the magic."""
    from IPython.core.inputtransformer2 import TransformerManager

    manager = TransformerManager()
    parts = [IPYTHON_HEADER]
    bad = 0
    for number, source in enumerate(cells, 1):
        first, _, body = source.lstrip().partition("\n")
        if first.split() and first.split()[0] in CODE_CELL_MAGICS:
            source = body
        try:
            code = manager.transform_cell(source)
            ast.parse(code)
        except (SyntaxError, ValueError, IndexError):
            bad += 1
            continue
        parts.append(f"# cell {number}\n{code}\n")
    return "\n".join(parts), bad


# ---------------------------------------------------------------- the ruff gate


def ruff_gate(paths: list[Path], keep_star: bool = False) -> list[dict[str, object]]:
    """The gate's findings; F405 (maybe from a star import) only with `keep_star`: it is not
    part of the gate, it helps reading the notebook's own script."""
    if not paths:
        return []
    done = subprocess.run(
        [*RUFF, "--output-format", "json", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found: list[dict[str, object]] = json.loads(done.stdout or "[]")
    return found if keep_star else [f for f in found if f.get("code") != "F405"]


def ruff_gate_text(source: str) -> list[dict[str, object]]:
    """The gate on one script (the notebook's own code)."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "notebook_script.py"
        script.write_text(source, encoding="utf-8")
        return ruff_gate([script], keep_star=True)


STAR_CHILD = r"""
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
    except BaseException:
        found[name] = None
        continue
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    found[name] = sorted(map(str, names))
print(json.dumps(found))
"""


def undefined_despite_star(script: str, baseline: list[dict[str, object]]) -> set[str]:
    """Names the notebook's script uses that ruff could only call "maybe from a star import"
    (F405) but that none of its star-imported modules defines: the notebook's own undefined
    names. Decided only where every star-imported module imports here (not the notebook's own
    helper modules: their names stay unknown, so the package must import them)."""
    maybe = {gate_key({**f, "code": "F821"})[1] for f in baseline if f.get("code") == "F405"}
    if not maybe:
        return set()
    stars = sorted(
        {
            node.module
            for node in ast.walk(ast.parse(script))
            if isinstance(node, ast.ImportFrom)
            and node.module
            and not node.level
            and any(a.name == "*" for a in node.names)
        }
    )
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [sys.executable, "-c", STAR_CHILD, *stars],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            env=child_env(Path(cwd)),
        )
    try:
        exported: dict[str, list[str] | None] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return set()
    if any(names is None for names in exported.values()):
        return set()
    defined = {n for names in exported.values() for n in names or []}
    return maybe - defined


def gate_key(finding: dict[str, object]) -> tuple[str, str]:
    code = str(finding.get("code") or "syntax")
    message = str(finding.get("message", ""))
    named = re.search(r"`([^`]+)`", message)
    if code in ("syntax", "E999", "invalid-syntax"):
        return ("syntax", "")
    if code == "F823":  # a local read before its assignment: undefined where no global has it
        code = "F821"
    return (code, named.group(1) if named else message)


def gate_line(finding: dict[str, object], root: Path) -> str:
    where = finding.get("location") or {}
    row = where.get("row", "?") if isinstance(where, dict) else "?"
    file = Path(str(finding.get("filename", ""))).resolve()
    try:
        shown = file.relative_to(root.resolve())
    except ValueError:
        shown = file
    return f"{shown}:{row}: {finding.get('code') or 'syntax'} {finding.get('message')}"


def split_gate(
    written: list[dict[str, object]],
    baseline: list[dict[str, object]],
    root: Path,
    undefined: Iterable[str] = (),
) -> tuple[list[str], list[str]]:
    """Errors of the written package that the notebook's own script also has (same code and
    name, as many times) are pre-existing; the rest the refactor introduced. The script leaves
    out the cells that do not parse, so a syntax error in the package is always introduced
    (the refactor refuses or skips such cells)."""
    allowance = Counter(gate_key(f) for f in baseline)
    allowance.update(("F821", name) for name in undefined)
    introduced, pre = [], []
    for finding in written:
        key = gate_key(finding)
        line = gate_line(finding, root)
        if allowance[key] > 0:
            allowance[key] -= 1
            pre.append(line)
        else:
            introduced.append(line)
    return introduced, pre


# ---------------------------------------------------------------- the written package


def find_package(out: Path) -> Path | None:
    """The top package folder the refactor wrote (tolerant of layout: `out/pkg`, `out/src/pkg`)."""
    found = []
    for init in out.rglob("__init__.py"):
        folder = init.parent
        parts = set(folder.relative_to(out).parts)
        if parts & {"tests", "docs", "__pycache__"} or (folder.parent / "__init__.py").exists():
            continue
        found.append(folder)
    return min(found, key=lambda p: len(p.parts)) if found else None


def modules_of(package: Path) -> list[tuple[str, Path]]:
    found = []
    for file in sorted(package.rglob("*.py")):
        if "__pycache__" in file.parts:
            continue
        parts = list(file.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append((".".join(parts), file))
    return found


def code_lines(source: str) -> set[int]:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    skip |= {tokenize.ENCODING, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                end = body[0].end_lineno or body[0].lineno
                lines -= set(range(body[0].lineno, end + 1))
    return lines


# Written from refactor/templates/, not from the notebook: not measured.
TEMPLATE_MODULES = frozenset({"__main__.py", "distributed.py"})


def measure_code(result: Result, package: Path) -> None:
    for _, file in modules_of(package):
        if file.name in TEMPLATE_MODULES and file.parent == package:
            continue
        source = file.read_text(encoding="utf-8")
        try:
            tree = ast.parse(source)
            lines = code_lines(source)
        except (SyntaxError, tokenize.TokenError, ValueError):
            continue
        result.code_lines += len(lines)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            params += [a for a in (args.vararg, args.kwarg) if a is not None]
            if params and params[0].arg in ("self", "cls"):
                params = params[1:]
            result.annotatable += len(params) + 1
            result.annotated += sum(p.annotation is not None for p in params)
            result.annotated += node.returns is not None
            if node.name == "run" and node in tree.body:
                start = node.body[0].lineno
                end = node.end_lineno or start
                result.run_lines += len({n for n in lines if start <= n <= end})


def snapshot(folder: Path) -> set[str]:
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    }


# Folders of third-party packages for the imports and the generated tests only (`--extra-path`):
# the refactor itself runs without them, so what it writes does not depend on them.
EXTRA_PATH: list[str] = []


def child_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = (str(root), env.get("PYTHONPATH", ""), *EXTRA_PATH)
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["MPLBACKEND"] = "Agg"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def import_modules(modules: list[str], package: Path, timeout: float) -> list[ModuleImport]:
    """Every module in turn, in one fresh interpreter (torch is imported once, not per module):
    an empty temporary working folder, PYTHONPATH = the output folder. A module that hangs
    ends the run; the modules after it are reported as not tried."""
    root = package.parent
    before = snapshot(root)
    with tempfile.TemporaryDirectory() as cwd, tempfile.TemporaryDirectory() as scratch:
        result_file = Path(scratch) / "result.json"
        try:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(result_file), package.name, *modules],
                cwd=cwd,
                env=child_env(root),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            ended = f"interpreter ended: exit {done.returncode} {done.stderr.strip()[-200:]}"
        except subprocess.TimeoutExpired:
            ended = f"still running after {timeout:.0f} s"
        try:
            found = json.loads(result_file.read_text())
        except (OSError, json.JSONDecodeError):
            found = []
    results = [
        ModuleImport(f["module"], f["status"], f.get("detail", ""), f["printed"][:300], f["wrote"])
        for f in found
    ]
    if len(results) < len(modules):
        status = "timeout" if ended.startswith("still") else "failed"
        results.append(ModuleImport(modules[len(results)], status, ended))
        results += [ModuleImport(m, "not tried") for m in modules[len(results) :]]
    wrote = sorted(snapshot(root) - before)
    if wrote and results:
        results[-1].wrote += [f"(output folder) {w}" for w in wrote]
    return results


def count_tests(out: Path) -> int:
    count = 0
    for file in out.rglob("test_*.py"):
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        count += sum(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
            for n in ast.walk(tree)
        )
    return count


def run_tests(out: Path, root: Path, timeout: float) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                "--rootdir",
                ".",
            ],
            cwd=out,
            env=child_env(root),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"pytest still running after {timeout:.0f} s"
    # pytest's own errors (a configuration it cannot read) go to stderr
    lines = [ln for ln in (done.stdout + "\n" + done.stderr).splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR", "E "))]
    return done.returncode == 0, (failed[0] if failed else lines[-1] if lines else "")[:300]


def read_report(result: Result, out: Path) -> None:
    reports = sorted(out.glob("*REPORT*.md")) or sorted(out.rglob("*REPORT*.md"))
    if not reports:
        return
    text = reports[0].read_text(encoding="utf-8")
    versions = re.search(r"versions kept:\s*(\d+)", text, re.IGNORECASE)
    refused = re.search(r"refused cells:\s*(\d+)", text, re.IGNORECASE)
    result.versions = int(versions.group(1)) if versions else 0
    if refused:
        result.refused = int(refused.group(1))
    else:
        result.refused = len(re.findall(r"^\|\s*\d+\s*\|\s*(?:skipped|refused)", text, re.M))
    gate = re.search(r"^#*\s*gate:?\s*(.*?)(?:\n#|\Z)", text, re.IGNORECASE | re.M | re.S)
    if gate:
        result.report_gate = " ".join(gate.group(1).split())[:200]


# ---------------------------------------------------------------- one notebook


def trainmate() -> list[str]:
    script = Path(sys.executable).parent / "trainmate"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "jupyter_trainmate.cli"]


def short_name(notebook: Path) -> str:
    """The output folder's name: the notebook's, cut to 80 characters, with a digest of the
    whole name where it was cut (two notebooks whose names differ only past the cut, such as
    a course's "Week 1" and "Week 2" assignments, would share a folder and, with --jobs 2, each
    remove the other's package)."""
    name = re.sub(r"[^\w.-]+", "_", notebook.stem)
    if len(name) <= 80:
        return name
    return name[:71] + "-" + hashlib.sha1(notebook.stem.encode()).hexdigest()[:8]


def measure(notebook: Path, out_root: Path, timeout: float) -> Result:
    result = Result(notebook.name)
    cells = notebook_cells(notebook)
    result.cells = len(cells)
    result.lines = sum(bool(ln.strip()) for c in cells for ln in c.splitlines())
    out = out_root / short_name(notebook)
    shutil.rmtree(out, ignore_errors=True)
    command = [*trainmate(), "refactor", str(notebook), "-o", str(out), "--no-docs"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 and "--skip-bad-cells" in done.stderr:
        result.skip_bad_cells = True
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run(
            [*command, "--skip-bad-cells"], capture_output=True, text=True, timeout=timeout
        )
    result.seconds = time.perf_counter() - started
    result.exit = done.returncode
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        tb = " (traceback)" if "Traceback (most recent call last)" in done.stderr else ""
        if tb:  # the exception's line, not what libcst prints after it
            lines = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", ln)]
        result.error = (lines[-1] if lines else f"exit {done.returncode}")[:300] + tb
        return result
    package = find_package(out)
    if package is None:
        result.error = "no package folder (__init__.py) in the output"
        return result
    script, _ = notebook_script(cells)
    baseline = ruff_gate_text(script)
    written = ruff_gate(sorted(p for p in out.rglob("*.py") if "__pycache__" not in p.parts))
    undefined = undefined_despite_star(script, baseline)
    result.gate_introduced, result.gate_preexisting = split_gate(written, baseline, out, undefined)
    result.imports = import_modules([m for m, _ in modules_of(package)], package, 300)
    measure_code(result, package)
    result.tests = count_tests(out)
    result.tests_passed, result.tests_output = run_tests(out, package.parent, 600)
    missing = re.search(r"No module named '([\w.]+)'", result.tests_output)
    if not result.tests_passed and missing and missing.group(1).split(".")[0] != package.name:
        result.tests_missing = missing.group(1).split(".")[0]
    read_report(result, out)
    return result


def measure_safely(
    notebook: Path, out_root: Path, timeout: float, extra: tuple[str, ...] = ()
) -> Result:
    EXTRA_PATH[:] = extra  # in the worker process
    try:
        return measure(notebook, out_root, timeout)
    except subprocess.TimeoutExpired:
        return Result(notebook.name, exit=-1, error=f"refactor still running after {timeout:.0f} s")
    except Exception as exc:  # one notebook's surprise must not stop the others
        return Result(notebook.name, exit=-1, error=f"benchmark: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- the table


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:4.0%}"


def median(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def row(r: Result) -> str:
    c = r.import_counts()
    imports = f"{c['ok']}/{len(r.imports)}" + (f" m{c['missing']}" if c["missing"] else "")
    imports += f" F{c['failed'] + c['timeout']}" if c["failed"] + c["timeout"] else ""
    imports += " dirty" if r.import_dirty() else ""
    tests = f"{r.tests} " + {True: "pass", False: "FAIL", None: "-"}[r.tests_passed]
    tests = f"{r.tests} miss" if r.tests_missing else tests
    status = "ok" if r.written else f"exit {r.exit}"
    status += " skip" if r.skip_bad_cells else ""
    return (
        f"{r.notebook[:58]:58} {r.cells:4d} {r.lines:5d} {status:10} "
        f"{len(r.gate_introduced):4d} {len(r.gate_preexisting):4d}  {imports:14} "
        f"{pct(r.run_share):>5} {pct(r.typed_share):>5}  {tests:8} {r.versions:4d} {r.refused:4d}"
        f" {r.seconds:6.1f}"
    )


def summary(results: list[Result]) -> dict[str, object]:
    written = [r for r in results if r.written]
    return {
        "notebooks": len(results),
        "written": len(written),
        "refactor_failed": len(results) - len(written),
        "with_introduced_gate_errors": sum(bool(r.gate_introduced) for r in written),
        "with_preexisting_gate_errors": sum(bool(r.gate_preexisting) for r in written),
        "with_import_failures": sum(
            any(m.status in ("failed", "timeout") for m in r.imports) for r in written
        ),
        "with_missing_third_party": sum(
            any(m.status == "missing" for m in r.imports) for r in written
        ),
        "import_not_clean": sum(bool(r.import_dirty()) for r in written),
        "median_run_share": median(r.run_share for r in written),
        "median_typed_share": median(r.typed_share for r in written),
        "median_tests": median(float(r.tests) for r in written),
        "tests_passing": sum(r.tests_passed is True for r in written),
        "tests_failing": sum(r.tests_passed is False and not r.tests_missing for r in written),
        "versions_kept": sum(r.versions for r in written),
        "refused_cells": sum(r.refused for r in written),
        "median_seconds": median(r.seconds for r in results),
        "missing_third_party": dict(
            Counter(m.detail for r in written for m in r.imports if m.status == "missing")
        ),
        "introduced_by_code": dict(
            Counter(line.split(": ")[1].split()[0] for r in written for line in r.gate_introduced)
        ),
        "import_failures_by_type": dict(
            Counter(
                m.detail.split(":")[0] if m.status == "failed" else m.status
                for r in written
                for m in r.imports
                if m.status in ("failed", "timeout")
            )
        ),
    }


def print_table(results: list[Result]) -> None:
    print(
        f"{'notebook':58} {'cell':>4} {'lines':>5} {'refactor':10} {'gate':>4} {'pre':>4}  "
        f"{'import':14} {'run':>5} {'typed':>5}  {'tests':8} {'vers':>4} {'refu':>4} {'sec':>6}"
    )
    for r in results:
        print(row(r))
    s = summary(results)
    print()
    print(
        f"{s['written']}/{s['notebooks']} packages written; {s['with_introduced_gate_errors']} with "
        f"gate errors the refactor introduced ({s['with_preexisting_gate_errors']} with the "
        f"notebook's own); {s['with_import_failures']} with a module that fails to import, "
        f"{s['with_missing_third_party']} missing a third-party package, "
        f"{s['import_not_clean']} printing or writing files on import"
    )
    print(
        f"medians: run() {pct(s['median_run_share'])}, annotated {pct(s['median_typed_share'])}"  # type: ignore[arg-type]
        f", tests {s['median_tests']}, refactor {s['median_seconds']:.1f} s; tests pass in "
        f"{s['tests_passing']}/{s['written']} (fail for another reason than a missing "
        f"third-party package in {s['tests_failing']}); versions kept {s['versions_kept']}, "
        f"refused cells {s['refused_cells']}"
    )
    print(f"introduced gate errors by code: {s['introduced_by_code']}")
    print(f"import failures by type: {s['import_failures_by_type']}")
    print(f"missing third-party modules: {s['missing_third_party']}")
    print()
    for r in results:
        problems = [f"refactor: {r.error}"] if r.error else []
        problems += [f"gate: {line}" for line in r.gate_introduced[:5]]
        if len(r.gate_introduced) > 5:
            problems.append(f"gate: ... and {len(r.gate_introduced) - 5} more")
        problems += [
            f"import {m.module}: {m.status}: {m.detail}"
            for m in r.imports
            if m.status in ("failed", "timeout")
        ]
        problems += [
            f"import {m.module}: printed {m.printed[:100]!r} wrote {m.wrote[:3]}"
            for m in r.import_dirty()
        ]
        if r.tests_passed is False and not r.tests_missing:
            problems.append(f"tests: {r.tests_output}")
        if problems:
            print(f"{r.notebook}:")
            for problem in problems:
                print(f"    {problem}")


def markdown_table(results: list[Result]) -> str:
    """The per-notebook table for BENCHMARKS.md (names from refactor_corpus.toml when listed)."""
    import tomllib

    manifest = Path(__file__).with_name("refactor_corpus.toml")
    listed = {e["file"]: e for e in tomllib.loads(manifest.read_text())["notebook"]}
    lines = [
        "| notebook | cells | lines | refactor | gate introduced / own | imports ok / missing "
        "3rd-party / failed | in `run()` | annotated | tests |",
        "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | --- |",
    ]
    for r in results:
        entry = listed.get(r.notebook)
        name = r.notebook.removesuffix(".ipynb")
        if entry:
            name = f"{entry['repository'].split('/')[1]}: {Path(entry['path']).stem}"
        c = r.import_counts()
        status = "ok" if r.written else f"exit {r.exit}: {r.error[:60]}"
        status += ", --skip-bad-cells" if r.skip_bad_cells else ""
        tests = {True: "pass", False: "FAIL", None: "-"}[r.tests_passed]
        tests = f"needs {r.tests_missing}" if r.tests_missing else tests
        lines.append(
            f"| {name} | {r.cells} | {r.lines} | {status} | {len(r.gate_introduced)} / "
            f"{len(r.gate_preexisting)} | {c['ok']}/{len(r.imports)}, {c['missing']}, "
            f"{c['failed'] + c['timeout']} | {pct(r.run_share).strip()} | "
            f"{pct(r.typed_share).strip()} | {r.tests} {tests} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("corpus", type=Path, help="folder of .ipynb files")
    parser.add_argument("--out", type=Path, help="where the packages go (default: a temp folder)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks at once (default 2)")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--markdown", type=Path, help="also write the table in Markdown here")
    parser.add_argument("--only", help="only notebooks whose file name contains this")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per refactor")
    parser.add_argument(
        "--extra-path",
        action="append",
        default=[],
        help="a folder of third-party packages (pip install --target) for the package imports "
        "and tests, not for the refactor (benchmarks/refactor_corpus_env.py builds one)",
    )
    args = parser.parse_args(argv)
    notebooks = sorted(args.corpus.glob("*.ipynb"))
    if args.only:
        notebooks = [n for n in notebooks if args.only in n.name]
    if not notebooks:
        print(f"{args.corpus}: no .ipynb files", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out_root = (args.out or Path(tmp)).resolve()
        out_root.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [
                pool.submit(
                    measure_safely,
                    nb.resolve(),
                    out_root,
                    args.timeout,
                    tuple(str(Path(p).resolve()) for p in args.extra_path),
                )
                for nb in notebooks
            ]
            for done, future in enumerate(as_completed(futures), 1):
                r = future.result()
                print(f"[{done}/{len(futures)}] {r.notebook}: {r.seconds:.1f} s", file=sys.stderr)
            results = [f.result() for f in futures]
    print_table(results)
    if args.markdown:
        args.markdown.write_text(markdown_table(results), encoding="utf-8")
    if args.json:
        data = {"summary": summary(results), "notebooks": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
