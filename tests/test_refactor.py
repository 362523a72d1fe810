"""`trainmate refactor`: the bundled test notebooks become packages that install, import without
side effects, pass ruff and pyflakes, train, and come out byte-identical on a second run."""

from __future__ import annotations

import ast
import atexit
import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import pytest

from .cli_harness import trainmate

NOTEBOOKS = Path(__file__).parent / "notebooks"
GOOD = ["kitchen_sink", "realistic_training", "nbdev_style", "old_v3"]
ROOT = Path(__file__).parent.parent


def refactored(name: str, out: Path) -> Path:
    proc = trainmate("refactor", NOTEBOOKS / f"{name}.ipynb", "-o", out, "--skip-bad-cells")
    assert proc.returncode == 0, proc.stderr
    return out


_MYPY_CACHE: list[str] = []  # this test process's mypy cache folder, made at the first call


def mypy(cwd: Path, package: str) -> subprocess.CompletedProcess[str]:
    """mypy on a generated package as its user would run it, with no cache left behind in it.

    The cache is this test process's own, in a temporary folder made at the first call and
    used by no other run: mypy's incremental mode gives the same errors as `--no-incremental`,
    and torch's stubs are analysed once per test process instead of once per call (about 35 s
    each time, six calls)."""
    if not _MYPY_CACHE:
        _MYPY_CACHE.append(tempfile.mkdtemp(prefix="trainmate-tests-mypy-"))
        atexit.register(shutil.rmtree, _MYPY_CACHE[0], ignore_errors=True)  # about 60 MB
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--cache-dir", _MYPY_CACHE[0],
         package],
        cwd=cwd, capture_output=True, text=True, check=False,
    )  # fmt: skip


def generated_tests(cwd: Path) -> subprocess.CompletedProcess[str]:
    """The generated package's own pytest tests, run in its folder."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("refactored")
    return {name: refactored(name, base / name) for name in GOOD}


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize("name", GOOD)
def test_a_second_run_is_byte_identical(name: str, built: dict[str, Path], tmp_path: Path) -> None:
    again = files_of(refactored(name, tmp_path / "again"))
    first = files_of(built[name])
    assert first.keys() == again.keys()
    assert [k for k in first if first[k] != again[k]] == []


@pytest.mark.parametrize("name", GOOD)
def test_ruff_and_pyflakes_report_nothing(name: str, built: dict[str, Path]) -> None:
    from ruff.__main__ import find_ruff_bin

    out = built[name]
    ruff = subprocess.run(
        [os.fsdecode(find_ruff_bin()), "check", "--no-cache", "."],
        cwd=out,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ruff.returncode == 0, ruff.stdout
    flakes = subprocess.run(
        [sys.executable, "-m", "pyflakes", str(out / name)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (flakes.returncode, flakes.stdout, flakes.stderr) == (0, "", "")
    assert "`ruff check`: clean" in (out / "REFACTOR_REPORT.md").read_text()


DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)


@pytest.mark.parametrize("name", GOOD)
def test_modules_only_define_things_at_top_level(name: str, built: dict[str, Path]) -> None:
    """Statically: a module's top level is imports, definitions, constants and its docstring."""
    for path in sorted((built[name] / name).glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, DEFINITIONS):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, ast.Assign | ast.AnnAssign):
                value = node.value
                assert value is not None
                ast.literal_eval(value)  # constants only: raises on anything computed
                continue
            if isinstance(node, ast.If) and path.name == "__main__.py":
                continue  # `if __name__ == "__main__":`
            if (
                isinstance(node, ast.If)
                and ast.unparse(node.test) == "TYPE_CHECKING"
                and all(isinstance(s, ast.Import | ast.ImportFrom) for s in node.body)
                and not node.orelse
            ):
                continue  # imports for the annotations only: nothing runs
            raise AssertionError(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")


@pytest.mark.slow
def test_packages_install_into_a_fresh_venv_and_import_without_side_effects(
    built: dict[str, Path], tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # torch and the rest come from this test environment (no downloads); the packages install
    # into the new venv for real, from their own pyproject.toml
    # (addsitedir, not a plain path: the editable install of jupyter_trainmate is itself a .pth)
    outer = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    Path(purelib, "outer_site.pth").write_text(outer)
    # the build backend (setuptools) also comes from this environment: the venv's own is too old
    # to build wheels without the `wheel` package, and there are no downloads here
    build_env = {**os.environ, "PYTHONPATH": os.pathsep.join(site.getsitepackages())}
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + [str(built[n]) for n in GOOD],
        capture_output=True,
        text=True,
        check=False,
        env=build_env,
    )
    assert install.returncode == 0, install.stderr
    for name in GOOD:
        modules = sorted(p.stem for p in (built[name] / name).glob("*.py"))
        empty = tmp_path / f"cwd-{name}"
        home = tmp_path / f"home-{name}"
        empty.mkdir()
        home.mkdir()
        code = "import importlib\n" + "".join(
            f"importlib.import_module('{name}.{m}')\n" for m in modules if m != "__main__"
        )
        env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [python, "-c", code], cwd=empty, env=env, capture_output=True, text=True, check=False
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), name
        assert list(empty.iterdir()) == [], name  # no files written by an import
        assert list(home.iterdir()) == [], name
        where = subprocess.run(
            [python, "-c", f"import {name}; print({name}.__file__)"],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert where.startswith(str(env_dir)), where  # the installed copy, not the source tree
        for args in (["--help"], ["train", "--help"]):
            helped = subprocess.run(
                [python, "-m", name, *args], cwd=empty, env=env, capture_output=True, text=True
            )
            assert helped.returncode == 0, helped.stderr
            assert "usage: python -m" in helped.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["realistic_training", "kitchen_sink"])
def test_the_package_trains_on_a_cpu(name: str, built: dict[str, Path], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(built[name])}
    proc = subprocess.run(
        [sys.executable, "-m", name, "train", "--epochs", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trainmate: finished after 1 epoch(s)" in proc.stdout  # the %%train cell, on the runtime
    records = [json.loads(line) for line in (tmp_path / "runs" / "runs.jsonl").open()]
    assert records[-1]["outcome"] == "finished"
    if name == "realistic_training":
        assert "epoch 0: train" in proc.stdout
        assert (tmp_path / "model.pt").exists()  # written by run(), not by an import
    else:
        assert "trained True" in proc.stdout  # the __main__ gate's body ran in run()


def test_kitchen_sink_went_where_it_should(built: dict[str, Path]) -> None:
    out = built["kitchen_sink"]
    pkg = out / "kitchen_sink"
    code = {p.name: p.read_text() for p in pkg.glob("*.py")}
    everything = "\n".join(code.values())
    report = (out / "REFACTOR_REPORT.md").read_text()
    pyproject = (out / "pyproject.toml").read_text()
    for requirement in ('"tqdm>=4.60"', '"rich==13.7.1"', '"packaging"', '"torch"'):
        assert requirement in pyproject
    assert (out / "settings.txt").read_text() == "name = sink\n"  # %%writefile
    assert "%matplotlib inline" in report
    assert "%watermark" in report
    assert "%cd /tmp" in report
    assert "%%bash" in report
    assert "# notebook: %cd /tmp (not converted)" in code["train.py"]
    assert "subprocess.run(" in code["train.py"]
    assert "shell output" in report
    assert "pass  # notebook: !echo {f} (not converted)" in code["train.py"]  # indented !cmd
    assert "count = len(loader)" in code["train.py"]  # %%time body kept
    assert "n_batches = len(loader)" in code["train.py"]  # %time statement kept
    assert "% (NAME, acc)" in code["train.py"]  # %-formatting on a continuation line: not a magic
    assert "def accuracy(" in code["metrics.py"]  # cell tag trainmate:module=metrics
    assert "class Net(nn.Module)" in code["model.py"]
    assert "\t" not in code["model.py"]
    assert ".cuda(" not in everything
    assert "cuda:2" not in everything
    assert ".to(device)" in code["train.py"]
    assert 'device: str = "auto"' in code["config.py"]
    assert 'print("trained", trained, acc)' in code["train.py"]  # __main__ gate opened
    assert "fit is defined again in cell" in report  # the last definition wins
    assert code["train.py"].count("def fit(") == 1
    bad = [line for line in report.splitlines() if line.startswith("- cell") and "parse" in line]
    assert len(bad) == 1
    assert "line 1: skipped: does not parse: invalid syntax" in bad[0]
    assert re.search(r"jupyter_trainmate\.train\(\s*train_cell_\d+", code["train.py"])  # %%train
    # a function reading notebook state receives it, and its callers pass it
    assert (
        "def step(xb, yb, *, opt: torch.optim.SGD, model: Net, device: torch.device)"
        in (code["train.py"])
    )
    assert "step(xb, yb, opt=opt, model=model, device=device)" in code["train.py"]


def test_nbdev_markers_choose_the_module_and_what_is_exported(built: dict[str, Path]) -> None:
    pkg = built["nbdev_style"] / "nbdev_style"
    layers = (pkg / "layers.py").read_text()
    assert "class Scale(nn.Module)" in layers
    assert "def double(" in layers
    assert "scratch" not in "\n".join(p.read_text() for p in pkg.glob("*.py"))
    assert "scratch: not `#| export`ed" in (built["nbdev_style"] / "REFACTOR_REPORT.md").read_text()


def test_an_nbformat_3_notebook_is_upgraded(built: dict[str, Path]) -> None:
    pkg = built["old_v3"] / "old_v3"
    assert "*, scale: int = SCALE)" in (pkg / "utils.py").read_text()  # kw-only, typed default
    assert "SCALE = 3" in (pkg / "config.py").read_text()


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = trainmate("refactor", NOTEBOOKS / "nbdev_style.ipynb", "-o", out, "--dry-run")
    assert proc.returncode == 0
    assert "## Cells" in proc.stdout
    assert "## Parameters created" in proc.stdout
    assert not out.exists()


def test_force_replaces_what_it_wrote_and_the_notebook_is_never_modified(tmp_path: Path) -> None:
    notebook = tmp_path / "nb.ipynb"
    notebook.write_bytes((NOTEBOOKS / "old_v3.ipynb").read_bytes())
    before = hashlib.sha256(notebook.read_bytes()).hexdigest()
    out = tmp_path / "pkg"
    assert trainmate("refactor", notebook, "-o", out).returncode == 0
    (out / "stale.txt").write_text("from an earlier run")
    refused = trainmate("refactor", notebook, "-o", out)
    assert refused.returncode == 2
    assert (out / "stale.txt").exists()  # nothing touched without --force
    (out / "nb" / "utils.py").unlink()  # a file the user deleted is simply written again
    assert trainmate("refactor", notebook, "-o", out, "--force").returncode == 0
    assert (out / "stale.txt").exists()  # not the refactor's: --force never removes it (issue 12)
    assert "SCALE" in (out / "nb" / "utils.py").read_text()
    assert hashlib.sha256(notebook.read_bytes()).hexdigest() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON (line 1"),
        ("[1, 2]", "not a notebook"),
        ('{"cells": []}', "not a notebook (no nbformat field)"),
        (None, "no such file"),
    ],
    ids=["not-json", "json-list", "no-nbformat", "missing"],
)
def test_bad_input_is_one_line_and_exit_2(
    content: str | None, message: str, tmp_path: Path
) -> None:
    notebook = tmp_path / "bad.ipynb"
    if content is not None:
        notebook.write_text(content)
    proc = trainmate("refactor", notebook, "-o", tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert str(notebook) in proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_output_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    proc = trainmate("refactor", NOTEBOOKS / "old_v3.ipynb", "-o", tmp_path / "out")
    assert (proc.returncode, proc.stderr.count("\n")) == (2, 1)
    assert "exists; add --force" in proc.stderr


def test_a_cell_that_does_not_parse_names_its_cell_and_line(tmp_path: Path) -> None:
    proc = trainmate("refactor", NOTEBOOKS / "kitchen_sink.ipynb", "-o", tmp_path / "out")
    assert (proc.returncode, proc.stderr.count("\n")) == (2, 1)
    cells = json.loads((NOTEBOOKS / "kitchen_sink.ipynb").read_text())["cells"]
    number = 1 + next(i for i, c in enumerate(cells) if "<YOUR CODE HERE>" in "".join(c["source"]))
    assert f"kitchen_sink.ipynb: cell {number}, line 1: cannot parse" in proc.stderr
    assert "--skip-bad-cells" in proc.stderr


@pytest.mark.slow
def test_the_bundled_quickstart_with_execute_meets_the_bar(tmp_path: Path) -> None:
    """The bundled example: equivalence passes, 90%+ annotated, mypy quiet, pdoc documents every
    public symbol, the generated tests pass."""
    out = tmp_path / "q"
    notebook = ROOT / "notebooks" / "quickstart.ipynb"
    proc = trainmate("refactor", notebook, "-o", out, "--execute", "--check-equivalence")
    assert proc.returncode == 0, proc.stderr
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "`ruff check`: clean" in report
    assert "PASSED: the notebook's numbers" in report
    found = re.search(r"(\d+) of (\d+) parameters and returns annotated", report)
    assert found is not None
    assert int(found.group(1)) / int(found.group(2)) >= 0.9
    checked = mypy(cwd=out, package="quickstart")
    assert checked.returncode == 0, checked.stdout
    env = {**os.environ, "PYTHONPATH": str(out), "PYTHONDONTWRITEBYTECODE": "1"}
    pdoc = subprocess.run(
        [sys.executable, "-c", PDOC_COVERAGE, "quickstart"], env=env, capture_output=True, text=True
    )
    assert (pdoc.returncode, pdoc.stdout) == (0, "")
    assert (out / "docs" / "quickstart.html").exists()
    tests = generated_tests(cwd=out)
    assert tests.returncode == 0, tests.stdout[-2000:]


def test_without_execute_the_generated_import_tests_pass(built: dict[str, Path]) -> None:
    out = built["kitchen_sink"]
    assert sorted(p.name for p in (out / "tests").glob("test_*.py")) == ["test_import.py"]
    proc = generated_tests(cwd=out)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "need --execute" in (out / "REFACTOR_REPORT.md").read_text()


PDOC_COVERAGE = """
import importlib, pkgutil, sys
import pdoc.doc
package = importlib.import_module(sys.argv[1])
names = [sys.argv[1]] + [f"{sys.argv[1]}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
for name in names:
    for member in pdoc.doc.Module(importlib.import_module(name)).flattened_own_members:
        if not member.name.startswith("_") and not member.docstring.strip():
            print(member.fullname)
"""


@pytest.mark.parametrize("name", ["realistic_training", "kitchen_sink"])
def test_pdoc_docs_are_built_and_every_public_symbol_has_a_docstring(
    name: str, built: dict[str, Path]
) -> None:
    out = built[name]
    assert (out / "docs" / "index.html").exists()
    assert (out / "docs" / f"{name}.html").exists()
    assert "API docs (pdoc): `docs/index.html`" in (out / "REFACTOR_REPORT.md").read_text()
    env = {**os.environ, "PYTHONPATH": str(out), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PDOC_COVERAGE, name], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # the names of undocumented public symbols, one per line


def test_docstrings_come_from_the_notebooks_markdown(built: dict[str, Path]) -> None:
    pkg = built["realistic_training"] / "realistic_training"
    data = (pkg / "data.py").read_text()
    # the markdown cell above make_images: "Synthetic images whose class is the brightest quadrant."
    assert '"""Synthetic images whose class is the brightest quadrant."""' in data
    assert "From the sections: Data." in data  # the module docstring names its sections
    card = (built["realistic_training"] / "MODEL_CARD.md").read_text()
    assert "`realistic_training.model.SmallNet`" in card
    assert "| `lr` | `0.003` |" in card


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("executed") / "realistic_training"
    proc = trainmate(
        "refactor",
        NOTEBOOKS / "realistic_training.ipynb",
        "-o",
        out,
        "--execute",
        "--check-equivalence",
        "--no-docs",
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
def test_execute_annotates_nine_in_ten_and_mypy_finds_nothing(executed: Path) -> None:
    report = (executed / "REFACTOR_REPORT.md").read_text()
    found = re.search(r"(\d+) of (\d+) parameters and returns annotated \((\d+)%\)", report)
    assert found is not None
    assert int(found.group(1)) / int(found.group(2)) >= 0.9
    checked = mypy(cwd=executed, package="realistic_training")
    assert checked.returncode == 0, checked.stdout
    model = (executed / "realistic_training" / "model.py").read_text()
    assert "def forward(self, x: Tensor) -> Tensor:" in model
    assert "- x: float32[64, 3, 8, 8] (cpu)" in model  # the shapes seen, in the docstring
    train = (executed / "realistic_training" / "train.py").read_text()
    assert "opt: AdamW," in train  # the type the notebook passed, by its public name
    assert "from torch.optim import AdamW" in train


@pytest.mark.slow
def test_generated_tests_pass_three_times_in_a_row(executed: Path) -> None:
    tests = sorted(p.name for p in (executed / "tests").glob("test_*.py"))
    assert tests == [
        "test_characterisation.py",
        "test_datasets.py",
        "test_import.py",
        "test_models.py",
    ]
    for _ in range(3):
        proc = generated_tests(cwd=executed)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert " passed" in proc.stdout
        assert "skipped" not in proc.stdout


@pytest.mark.slow
def test_static_types_alone_keep_mypy_quiet(built: dict[str, Path]) -> None:
    for name in GOOD:
        checked = mypy(cwd=built[name], package=name)
        assert checked.returncode == 0, (name, checked.stdout)
        assert "static inference only" in (built[name] / "REFACTOR_REPORT.md").read_text()


def test_execute_names_the_cell_that_needs_a_missing_file(tmp_path: Path) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = tmp_path / "needs_data.ipynb"
    cells = [new_code_cell("import os"), new_code_cell("rows = open('data/train.csv').read()")]
    nbformat.write(new_notebook(cells=cells), notebook)
    proc = trainmate("refactor", notebook, "-o", tmp_path / "out", "--execute", "--no-docs")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "cell 2 needs a file it cannot find in the fresh working folder" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_package_computes_what_the_notebook_computed(executed: Path) -> None:
    report = (executed / "REFACTOR_REPORT.md").read_text()
    assert "PASSED: the notebook's numbers against the package's `run(Config())`" in report
    rows = [line for line in report.splitlines() if line.startswith("| `")]
    names = {line.split("`")[1] for line in rows}
    assert {"history", "valid_acc", "baseline_acc", "model2_acc", "per_class"} <= names
    assert all(line.endswith("| yes |") for line in rows)
    assert "`LR`" not in report.split("## Equivalence")[1]  # hyperparameters: equal by construction


def test_an_equivalence_failure_is_exit_2_and_reported(tmp_path: Path) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = tmp_path / "process.ipynb"
    # the notebook's kernel and the package's run are two processes: their pids differ
    cells = [new_code_cell("import os"), new_code_cell("pid = float(os.getpid())")]
    nbformat.write(new_notebook(cells=cells), notebook)
    out = tmp_path / "out"
    proc = trainmate(
        "refactor", notebook, "-o", out, "--execute", "--check-equivalence", "--no-docs"
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "the equivalence check failed: pid" in proc.stderr
    assert "| `pid` |" in (out / "REFACTOR_REPORT.md").read_text()  # written, with the table
