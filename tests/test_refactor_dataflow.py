"""`trainmate refactor` on the failure classes real notebooks showed: redefined functions, `global`
state, names from star imports and shadowed imports, undefined names. Each notebook of our own
(tests/notebooks/dataflow_*.ipynb) runs on a CPU in a second, so `--execute --check-equivalence`
proves the package computes what the notebook computed; the gate (`ruff check --select
E9,F63,F7,F82,F811`) is clean and every module imports with no output and no file written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_trainmate.refactor.gate import check as gate
from jupyter_trainmate.refactor.read import read

from .cli_harness import trainmate

NOTEBOOKS = Path(__file__).parent / "notebooks"
DATAFLOW = ["dataflow_versions", "dataflow_globals", "dataflow_names"]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dataflow")
    out: dict[str, Path] = {}
    for name in DATAFLOW:
        folder = base / name
        proc = trainmate(
            "refactor", NOTEBOOKS / f"{name}.ipynb", "-o", folder, "--execute",
            "--check-equivalence", "--no-docs",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr  # exit 2 when the equivalence check fails
        out[name] = folder
    return out


def code_of(folder: Path, name: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((folder / name).glob("*.py"))}


def imports_quietly(folder: Path, package: str, module: str, tmp_path: Path) -> None:
    """Importing the module prints nothing, writes no file and raises nothing."""
    cwd = tmp_path / f"import-{module}"
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", f"import {package}.{module}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(folder), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), (module, proc.stderr)
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("name", DATAFLOW)
def test_the_package_computes_what_the_notebook_computed(
    name: str, executed: dict[str, Path]
) -> None:
    report = (executed[name] / "REFACTOR_REPORT.md").read_text()
    assert "PASSED: the notebook's numbers against the package's `run(Config())`" in report
    rows = [ln for ln in report.split("## Equivalence")[1].splitlines() if ln.startswith("| `")]
    assert len(rows) >= 3
    assert all(ln.endswith("| yes |") for ln in rows)


@pytest.mark.parametrize("name", DATAFLOW)
def test_the_gate_is_clean_and_every_module_imports_quietly(
    name: str, executed: dict[str, Path], tmp_path: Path
) -> None:
    folder = executed[name]
    checked = gate(folder, read(NOTEBOOKS / f"{name}.ipynb"), set())
    assert checked.introduced == ()
    assert "gate: 0 (" in (folder / "REFACTOR_REPORT.md").read_text()
    for module in code_of(folder, name):
        imports_quietly(folder, name, module.removesuffix(".py"), tmp_path)


def test_each_call_runs_the_version_live_where_it_stands(executed: dict[str, Path]) -> None:
    folder = executed["dataflow_versions"]
    code = code_of(folder, "dataflow_versions")
    report = (folder / "REFACTOR_REPORT.md").read_text()
    data = code["data.py"]
    assert data.count("def split_loss(") == 1
    assert data.count("def split_loss_v2(") == 1
    # `report` calls split_loss; the notebook ran it once with each version: one copy each
    assert "def report_split_loss_v2(" in data
    assert "return round(split_loss_v2(split" in data
    train = code["train.py"]
    first, second = train.split("def better_loss(")
    assert "split_loss(" in first
    assert "split_loss_v2(" not in first
    assert "report_split_loss_v2(" in second
    assert "split_loss_v2(" in second
    assert "versions kept: 2" in report
    assert "| 12 | 1 | `run()` | `split_loss` | `split_loss_v2` |" in report
    assert "| 12 | 2 | `run()` | `report` | `report_split_loss_v2` |" in report
    # SCALE is set again: the config holds the first value, the code after it the second
    assert "scale: float = SCALE" in code["config.py"]
    assert "SCALE = 1.0" in code["config.py"]
    assert "SCALE = 3.0" in second
    assert "2.5" not in code["config.py"]  # the comment above a constant is not its value


def test_the_script_is_section_functions_and_plots_run_only_when_asked(
    executed: dict[str, Path],
) -> None:
    folder = executed["dataflow_versions"]
    train = code_of(folder, "dataflow_versions")["train.py"]
    run = train.split("def run(")[1]
    assert re.search(r"first_train, first_report = first_loss\(config\)", run)
    assert "if config.plots:\n        plot(config, first_train, second_train)" in run
    assert "print(" not in run
    assert "plots: bool = False" in code_of(folder, "dataflow_versions")["config.py"]
    quiet = subprocess.run(
        [sys.executable, "-c", "from dataflow_versions.train import run; "
         "from dataflow_versions.config import Config; run(Config())"],
        cwd=folder, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (quiet.returncode, quiet.stdout) == (0, ""), quiet.stderr
    loud = subprocess.run(
        [sys.executable, "-m", "dataflow_versions", "train", "--plots"],
        cwd=folder, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert loud.returncode == 0, loud.stderr
    assert loud.stdout.startswith("losses 2.5 9.48")


def test_global_state_stays_module_state(executed: dict[str, Path]) -> None:
    folder = executed["dataflow_globals"]
    train = code_of(folder, "dataflow_globals")["train.py"]
    assert "def add_layer(width" in train
    assert "global layers" in train
    assert "def pad(seq" in train
    assert "max_length" not in train.split("def pad(")[1].split(")")[0]
    assert re.search(r"^layers: Any = None", train, re.M)
    report = (folder / "REFACTOR_REPORT.md").read_text()
    assert "`global_step`, `layers`, `max_length`, `offset`, `width`" in report


def test_star_imports_and_shadowed_imports(executed: dict[str, Path]) -> None:
    folder = executed["dataflow_names"]
    code = code_of(folder, "dataflow_names")
    assert "from helpers import *" in code["model.py"]  # embed uses double and HALF
    assert "from math import floor" not in "\n".join(code.values())  # the notebook's floor
    assert "def floor(" in "\n".join(code.values())
    assert (folder / "helpers.py").exists()


def test_an_undefined_name_is_listed_as_pre_existing_and_the_package_imports(
    tmp_path: Path,
) -> None:
    notebook = tmp_path / "undefined.ipynb"
    cells = [
        new_markdown_cell("# Undefined\n## Helpers"),
        new_code_cell("def scale(x):\n    return x * missing_factor"),
        new_code_cell("values = [1.0, 2.0]"),
    ]
    nbformat.write(new_notebook(cells=cells), notebook)
    out = tmp_path / "out"
    proc = trainmate("refactor", notebook, "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "gate: 0 (" in report
    assert "- cell 2, line 2: F821 Undefined name `missing_factor`" in report
    for module in code_of(out, "undefined"):
        imports_quietly(out, "undefined", module.removesuffix(".py"), tmp_path)


def test_the_notebooks_own_run_and_config_do_not_clash_with_the_packages(tmp_path: Path) -> None:
    notebook = tmp_path / "names.ipynb"
    cells = [
        new_markdown_cell("# Names\n## Setup"),
        new_code_cell("config = dict(lr=0.1)\nLR = 0.5"),
        new_markdown_cell("## Use"),
        new_code_cell("def run(a):\n    return a * LR"),
        new_code_cell("x = float(run(config['lr']))"),
    ]
    nbformat.write(new_notebook(cells=cells), notebook)
    out = tmp_path / "out"
    proc = trainmate(
        "refactor", notebook, "-o", out, "--execute", "--check-equivalence", "--no-docs"
    )
    assert proc.returncode == 0, proc.stderr
    code = code_of(out, "names")
    assert "def run_notebook(a" in code["utils.py"]
    assert "def run(run_config: Config)" in code["train.py"]
    assert "config = set_up()" in code["train.py"]
    assert "| `x` | 0.05 | 0.05 | yes |" in (out / "REFACTOR_REPORT.md").read_text()


def test_a_device_constant_read_by_a_callback_is_module_state_set_by_run(tmp_path: Path) -> None:
    notebook = tmp_path / "callback.ipynb"
    cells = [
        new_code_cell("import torch\ndevice = 'cuda'"),
        new_code_cell("def to_device(batch):\n    return [t.to(device) for t in batch]"),
        new_code_cell("moved = list(map(to_device, [[torch.zeros(2)]]))"),
    ]
    nbformat.write(new_notebook(cells=cells), notebook)
    out = tmp_path / "out"
    proc = trainmate("refactor", notebook, "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    code = code_of(out, "callback")
    assert code["config.py"].count("device: str") == 1  # Config.device ("auto") only
    assert "global device\n    device = resolve_device(config.device)" in code["train.py"]
    assert "gate: 0 (" in (out / "REFACTOR_REPORT.md").read_text()
    run = subprocess.run(
        [sys.executable, "-c", "from callback.train import run; from callback.config import "
         "Config; print(run(Config(device='cpu'))['moved'][0][0].device)"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "cpu\n"), run.stderr


def test_a_method_default_that_is_notebook_state_keeps_the_class_in_the_script(
    tmp_path: Path,
) -> None:
    notebook = tmp_path / "defaults.ipynb"
    cells = [
        new_code_cell("scale = float(len('abcd'))"),
        new_code_cell(
            "class Scaled:\n    def __init__(self, k=scale):\n        self.k = k\n\n"
            "    def apply(self, x):\n        return x * self.k"
        ),
        new_code_cell("value = Scaled().apply(2.0)"),
    ]
    nbformat.write(new_notebook(cells=cells), notebook)
    out = tmp_path / "out"
    proc = trainmate("refactor", notebook, "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    assert "gate: 0 (" in (out / "REFACTOR_REPORT.md").read_text()
    for module in code_of(out, "defaults"):
        imports_quietly(out, "defaults", module.removesuffix(".py"), tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", "from defaults.train import run; from defaults.config import "
         "Config; print(run(Config())['value'])"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "8.0\n"), run.stderr
