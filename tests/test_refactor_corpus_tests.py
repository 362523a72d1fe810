"""The generated tests of the real-notebook corpus (issue 12, "generated tests pass"): each class
of failure that was not a missing third-party package, reproduced by a notebook of our own in
`tests/notebooks/`, refactored statically; the package passes the gate and every module imports
quietly, so the generated import tests pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_refactor_dataflow import code_of, imports_quietly, trainmate
from tests.test_refactor_gate_classes import gate_findings

NOTEBOOKS = Path(__file__).parent / "notebooks"


def refactored(tmp_path: Path, name: str) -> Path:
    out = tmp_path / "out"
    proc = trainmate("refactor", NOTEBOOKS / f"{name}.ipynb", "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    return out


def generated_tests_pass(out: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", "."],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_an_import_path_ipython_9_removed_becomes_the_public_one(tmp_path: Path) -> None:
    """`from IPython.core.display import display, clear_output` fails on IPython 9 (sksq96's VAE:
    ImportError on importing the package's module): the package imports both from
    `IPython.display`, the report says so, and the notebook's other imports stay as written."""
    out = refactored(tmp_path, "corpus_imports")
    code = "\n".join(code_of(out, "corpus_imports").values())
    assert "IPython.core.display" not in code
    assert "from IPython.display import HTML, clear_output, display\n" in code  # ruff merges them
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "`display` imported from `IPython.display`: `IPython.core.display` no longer" in report
    assert gate_findings(out) == []
    for module in code_of(out, "corpus_imports"):
        imports_quietly(out, "corpus_imports", module.removesuffix(".py"), tmp_path)
    generated_tests_pass(out)


def test_no_type_check_goes_under_a_property(tmp_path: Path) -> None:
    """A `@property` whose own code fails mypy (pytorch_tabular's tutorial 04, `backbone`): the
    refactor's `@no_type_check` on top of `@property` raised AttributeError when the class was
    built, on import. It goes on the function itself, under `@property`; mypy stays clean."""
    out = refactored(tmp_path, "corpus_property")
    utils = code_of(out, "corpus_property")["utils.py"]
    assert "    @property\n    @no_type_check\n    def label(self)" in utils
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "mypy on the package: clean." in report
    assert '- `utils.Box.label`: Argument 1 to "append"' in report
    assert gate_findings(out) == []
    for module in code_of(out, "corpus_property"):
        imports_quietly(out, "corpus_property", module.removesuffix(".py"), tmp_path)
    generated_tests_pass(out)
    run = subprocess.run(
        [sys.executable, "-c", "from corpus_property.train import run; from corpus_property."
         "config import Config; r = run(Config()); print(r['name'], r['surface'])"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "box 9\n"), run.stderr


def test_a_model_method_calling_cuda_goes_with_the_device_to_train(tmp_path: Path) -> None:
    """A model class whose `forward` calls `.cuda()` (L1aoXingyu's VAE, second wave): the refactor
    writes `.to(device)` there, `device` being module state of `train`; the class stayed in
    `model.py`, which never binds `device` (F821 in the gate, NameError on a GPU). It goes to
    `train` with the state it reads, and the package trains as the notebook does."""
    out = refactored(tmp_path, "corpus_cuda_method")
    assert gate_findings(out) == []
    modules = code_of(out, "corpus_cuda_method")
    assert "eps = eps.to(device)" in modules["train.py"]
    assert "class Noisy" in modules["train.py"]
    assert "class Noisy" not in modules.get("model.py", "")
    # `"cuda" if ... else "cpu"` is left as written: no `device` read, no move, no module state
    assert 'self.where = "cuda" if torch.cuda.is_available() else "cpu"' in modules["model.py"]
    assert "class Mover reads" not in (out / "REFACTOR_REPORT.md").read_text()
    for module in modules:
        imports_quietly(out, "corpus_cuda_method", module.removesuffix(".py"), tmp_path)
    generated_tests_pass(out)
    run = subprocess.run(
        [sys.executable, "-c", "from corpus_cuda_method.train import run; from corpus_cuda_method"
         ".config import Config; r = run(Config(device='cpu')); print(r['final'])"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    printed, returned = run.stdout.split()  # the notebook's print(final), then run()'s result
    assert printed == returned
    assert float(returned) > 0


def test_pip_install_pins_and_option_values_give_installable_dependencies(tmp_path: Path) -> None:
    """`!pip3 install torch==1.2.0+cu92 ... -f URL` (omarsar's gentle introduction, second wave)
    became the dependency `torch==1.2.0+cu92`: a local version, on no public index (PyPI takes
    none), so the package did not install; `--trusted-host HOST` made HOST a dependency, and
    `!pip3 install subword-nmt &> log` (yandexdataschool's seq2seq) made `&>` and `log` two (pip
    refuses `&>`). The dependencies are the names, and the report still shows the commands."""
    out = refactored(tmp_path, "corpus_pip_pins")
    pyproject = (out / "pyproject.toml").read_text()
    deps = pyproject.split("dependencies = [\n", 1)[1].split("]", 1)[0].split()
    assert deps == ['"numpy>=1.20",', '"subword-nmt",', '"torch",', '"torchvision",']
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "-> dependencies ['torch', 'torchvision']" in report
    assert "`!pip3 install subword-nmt &> log` -> dependencies ['subword-nmt']" in report
    assert gate_findings(out) == []
    generated_tests_pass(out)


def test_the_shells_part_of_a_pip_line_is_no_requirement() -> None:
    """Redirections and what ends the command: `2>&1` names its own target, so the word after
    it (`|` here) is read, and `| tail -1` ends the command (`tail` was a dependency)."""
    from jupyter_trainmate.refactor.read import requirements_from

    assert requirements_from("pip install foo 2>&1 | tail -1") == ["foo"]
    assert requirements_from("pip install foo 2>&1 bar") == ["foo", "bar"]
    assert requirements_from("pip install foo &> log bar") == ["foo", "bar"]
    assert requirements_from("pip install foo > /dev/null 2>&1") == ["foo"]
    assert requirements_from("pip install -q a && pip install b; echo done") == ["a", "b"]


def test_a_module_beside_the_notebook_is_no_dependency(tmp_path: Path) -> None:
    """`from vocab import Vocab` where `vocab.py` is the notebook's own file (its repository's
    helper, second wave: joosthub-like `vocab`, `notmnist`): it was written into pyproject.toml
    as a dependency named `vocab` (an unrelated distribution, or none). It is left out, the
    report says how to bring it, and the package still imports with it beside."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "vocab.py").write_text(
        "class Vocab:\n    def __len__(self) -> int:\n        return 3\n"
    )
    cells = [
        "import numpy as np\nfrom vocab import Vocab",
        "v = Vocab()\nsize = int(np.sum([len(v), 2]))",
    ]
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nbformat.write(nb, folder / "words.ipynb")
    out = tmp_path / "out"
    proc = trainmate("refactor", folder / "words.ipynb", "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    pyproject = (out / "pyproject.toml").read_text()
    deps = pyproject.split("dependencies = [\n", 1)[1].split("]", 1)[0]
    assert '"numpy' in deps
    assert "vocab" not in deps
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "- not `vocab`: the notebook's own module (beside it" in report
    (out / "vocab.py").write_text((folder / "vocab.py").read_text())  # as the report says
    generated_tests_pass(out)
