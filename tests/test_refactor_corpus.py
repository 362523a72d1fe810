"""The measurements of `benchmarks/refactor_corpus.py` (on small inputs, without the refactor)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "refactor_corpus", ROOT / "benchmarks" / "refactor_corpus.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["refactor_corpus"] = module
    spec.loader.exec_module(module)
    return module


def test_notebook_script_runs_cells_through_ipython(corpus: ModuleType) -> None:
    script, bad = corpus.notebook_script(
        ["!pip install -q tqdm\n%matplotlib inline", "%%time\nx = 1", "def f(:\n    pass", "x"]
    )
    assert bad == 1
    assert "get_ipython().system('pip install -q tqdm')" in script
    assert "\nx = 1\n" in script
    assert "def f(" not in script
    assert corpus.ruff_gate_text(script) == []


def test_gate_counts_what_the_notebook_already_has(corpus: ModuleType, tmp_path: Path) -> None:
    baseline = corpus.ruff_gate_text("print(undefined_a)\n")
    assert [corpus.gate_key(f) for f in baseline] == [("F821", "undefined_a")]
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("print(undefined_a)\nprint(undefined_a)\nprint(device)\n")
    written = corpus.ruff_gate([package / "a.py"])
    introduced, pre = corpus.split_gate(written, baseline, tmp_path)
    assert len(pre) == 1
    assert "undefined_a" in pre[0]
    assert len(introduced) == 2
    assert any("device" in line for line in introduced)
    assert all(line.startswith("pkg/a.py:") for line in introduced)


def test_syntax_errors_in_the_package_are_introduced(corpus: ModuleType) -> None:
    written = corpus.ruff_gate_text("def f(:\n    pass\n")
    assert {corpus.gate_key(f) for f in written} == {("syntax", "")}
    introduced, pre = corpus.split_gate(written, [], Path("/"))
    assert len(introduced) == len(written)
    assert pre == []


def test_code_in_run_and_annotations(corpus: ModuleType, tmp_path: Path) -> None:
    package = tmp_path / "out" / "pkg"
    (tmp_path / "out" / "tests").mkdir(parents=True)
    package.mkdir()
    (tmp_path / "out" / "tests" / "__init__.py").write_text("")
    (package / "__init__.py").write_text('"""Docstring."""\n')
    (package / "train.py").write_text(
        '"""Module doc,\non two lines."""\n\n'
        "import torch  # a comment\n\n\n"
        "class Net:\n"
        "    def forward(self, x: int, y):\n"
        "        return x\n\n\n"
        "def run(config) -> None:\n"
        '    """Run."""\n'
        "    # comment only\n"
        "    a = 1\n\n"
        "    b = [\n        a,\n    ]\n"
    )
    assert corpus.find_package(tmp_path / "out") == package
    result = corpus.Result("nb.ipynb")
    corpus.measure_code(result, package)
    # code lines: import, class, def forward, return, def run, a = 1, b = [, a, ]
    assert result.code_lines == 9
    assert result.run_lines == 4
    # forward: x yes, y no, return no; run: config no, return yes
    assert (result.annotated, result.annotatable) == (2, 5)


def test_report_figures_when_present(corpus: ModuleType, tmp_path: Path) -> None:
    result = corpus.Result("nb.ipynb")
    (tmp_path / "REFACTOR_REPORT.md").write_text(
        "# Report\n\nVersions kept: 3\nrefused cells: 2\n\n## Gate\n\nclean\n\n## Types\n"
    )
    corpus.read_report(result, tmp_path)
    assert (result.versions, result.refused, result.report_gate) == (3, 2, "clean")
    (tmp_path / "REFACTOR_REPORT.md").write_text(
        "| cell | went to |\n| --- | --- |\n| 4 | skipped: does not parse |\n| 5 | x.run() |\n"
    )
    corpus.read_report(result, tmp_path)
    assert (result.versions, result.refused) == (0, 1)


def test_imports_are_checked_for_output_and_files(corpus: ModuleType, tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "clean.py").write_text("X = 1\n")
    (package / "noisy.py").write_text("print('hello')\nopen('made.txt', 'w').close()\n")
    (package / "broken.py").write_text("y = undefined_name\n")
    (package / "needs.py").write_text("import not_a_real_package_xyz\n")
    found = corpus.import_modules(
        ["pkg", "pkg.clean", "pkg.noisy", "pkg.broken", "pkg.needs"], package, 60
    )
    by_name = {m.module: m for m in found}
    assert by_name["pkg.clean"].status == "ok"
    assert not by_name["pkg.clean"].printed
    assert by_name["pkg.noisy"].printed == "hello"
    assert by_name["pkg.noisy"].wrote == ["made.txt"]
    assert by_name["pkg.broken"].status == "failed"
    assert by_name["pkg.broken"].detail.startswith("NameError: name 'undefined_name'")
    assert "broken.py:1" in by_name["pkg.broken"].detail
    assert (by_name["pkg.needs"].status, by_name["pkg.needs"].detail) == (
        "missing",
        "not_a_real_package_xyz",
    )


def test_names_no_star_import_defines_are_the_notebooks_own(corpus: ModuleType) -> None:
    script = "from typing import *\nx: Dict[str, Any] = {}\nprint(Bernoulli(1))\n"
    baseline = corpus.ruff_gate_text(script)
    assert {corpus.gate_key(f)[1] for f in baseline if f["code"] == "F405"} == {
        "Dict",
        "Any",
        "Bernoulli",
    }
    assert corpus.undefined_despite_star(script, baseline) == {"Bernoulli"}
    # a star import from a module that does not import here (the notebook's helper): unknown
    helper = "from my_course_helpers import *\nprint(Bernoulli(1))\n"
    assert corpus.undefined_despite_star(helper, corpus.ruff_gate_text(helper)) == set()


def test_extra_path_reaches_the_imports_not_the_refactor(
    corpus: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--extra-path DIR`: the package's imports (and tests) find third-party packages in DIR; a
    module that needs one is "missing" without it."""
    extra = tmp_path / "extra"
    (extra / "thirdparty_xyz").mkdir(parents=True)
    (extra / "thirdparty_xyz" / "__init__.py").write_text("VALUE = 3\n")
    package = tmp_path / "out" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "uses.py").write_text("from thirdparty_xyz import VALUE\n")
    without = corpus.import_modules(["pkg.uses"], package, 60)
    assert (without[0].status, without[0].detail) == ("missing", "thirdparty_xyz")
    monkeypatch.setattr(corpus, "EXTRA_PATH", [str(extra)])
    assert corpus.import_modules(["pkg.uses"], package, 60)[0].status == "ok"
    assert str(extra) in corpus.child_env(package.parent)["PYTHONPATH"].split(":")
