"""`trainmate refactor` on the failure classes the third wave of real notebooks showed
(`benchmarks/refactor_corpus3.toml`, BENCHMARKS.md "A third wave of real notebooks"): each a small
notebook of our own, refactored statically; the package passes the gate and computes what the
notebook computed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from tests.test_refactor_dataflow import code_of, imports_quietly
from tests.test_refactor_gate_classes import gate_findings, refactored


def run_value(out: Path, package: str, expression: str) -> str:
    """`expression` evaluated on `run(Config())`'s result (`result`), printed."""
    proc = subprocess.run(
        [sys.executable, "-c", f"from {package}.train import run; from {package}.config import "
         f"Config; result = run(Config()); print({expression})"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def clean(out: Path, package: str, tmp_path: Path) -> None:
    assert gate_findings(out) == []
    assert "gate: 0 (" in (out / "REFACTOR_REPORT.md").read_text()
    for module in code_of(out, package):
        imports_quietly(out, package, module.removesuffix(".py"), tmp_path)


def refactored_clean(tmp_path: Path, name: str, cells: list[NotebookNode]) -> Path:
    """The notebook `# Name` over `cells`, refactored statically, its package clean (`clean`)."""
    out = refactored(tmp_path, name, [new_markdown_cell(f"# {name.title()}"), *cells])
    clean(out, name, tmp_path)
    return out


def test_an_assignment_over_several_lines_reads_what_it_rebinds(tmp_path: Path) -> None:
    """`model, optimizer, train_loader = engine.make_private(\\n module=model, ...)` (opacus's
    tutorials): the names the value reads on the lines after the first are read before the
    statement binds them, so the section gets them from the earlier one (an F821 on each)."""
    out = refactored_clean(
        tmp_path,
        "wrapped",
        [
            new_markdown_cell("## Data"),
            new_code_cell("items = [3, 1, 2]\nscale = 10"),
            new_code_cell("def wrap(values, factor):\n    return sorted(values), factor * 2"),
            new_markdown_cell("## Wrap them"),
            new_code_cell("items, scale = wrap(\n    items,\n    factor=scale,\n)"),
            new_code_cell("total = sum(items) * scale"),
        ],
    )
    assert run_value(out, "wrapped", "result['items'], result['total']") == "[1, 2, 3] 120"


def test_an_init_parameter_named_as_a_global_a_method_reads(tmp_path: Path) -> None:
    """`__init__(self, layers)` and a `forward` that reads the notebook's global `layers`
    (two PINN notebooks): the parameter is `__init__`'s own, so the class reads `layers` only
    outside `__init__` (module state), and its constructor is not given `layers` twice (mypy:
    "gets multiple values for keyword argument"; the gate: `layers` undefined in `forward`)."""
    out = refactored_clean(
        tmp_path,
        "pinn",
        [
            new_markdown_cell("## Model"),
            new_code_cell(
                "class Net:\n    def __init__(self, layers):\n        self.sizes = "
                "[layers[i] * layers[i + 1] for i in range(len(layers) - 1)]\n\n"
                "    def forward(self, x):\n        for i in range(len(layers) - 2):\n"
                "            x = x + self.sizes[i]\n        return x"
            ),
            new_markdown_cell("## Train"),
            new_code_cell("layers = [2, 3, 4, 1]\nnet = Net(layers)\nout = net.forward(1)"),
        ],
    )
    assert "layers=layers" not in code_of(out, "pinn")["train.py"]
    assert run_value(out, "pinn", "result['out']") == "19"


def test_a_class_that_derives_from_the_import_it_shadows(tmp_path: Path) -> None:
    """`from gpytorch.models.deep_gps import DeepGP` and then `class DeepGP(DeepGP):`: the
    class's base is the imported class, read before the class binds the name; its module imports
    it under an alias (it had no import: `DeepGP` undefined on import)."""
    out = refactored_clean(
        tmp_path,
        "shadow",
        [
            new_markdown_cell("## Model"),
            new_code_cell("from fractions import Fraction"),
            new_code_cell(
                "class Fraction(Fraction):\n    def half(self):\n        return self / 2"
            ),
            new_markdown_cell("## Use it"),
            new_code_cell("value = float(Fraction(3, 1).half())"),
        ],
    )
    assert run_value(out, "shadow", "result['value']") == "1.5"
    # the class reads the import under an alias: mypy takes `Fraction` for the class (with the
    # import under its own name it reported no-redef and decorated the function using it)
    assert "mypy on the package: clean" in (out / "REFACTOR_REPORT.md").read_text()
    assert "import Fraction as Fraction_import" in "".join(code_of(out, "shadow").values())


def test_a_function_whose_name_a_later_statement_rebinds(tmp_path: Path) -> None:
    """`def train_xgb(...)`, then in one cell `(...) = train_xgb(train, valid)` and `train_xgb
    = evaluate(...)` (josiahdavis/tabular): as a section function that read a local before
    binding it (`F823`, UnboundLocalError). The value keeps the name (it is the notebook's
    final state); the function becomes a version of its own, and the report says which call
    uses it."""
    out = refactored_clean(
        tmp_path,
        "rebound",
        [
            new_markdown_cell("## Fit"),
            new_code_cell("def train_xgb(a, b):\n    return a + b, a * b"),
            new_code_cell(
                "total, product = train_xgb(2, 3)\ntrain_xgb = {'total': total, 'product': product}"
            ),
            new_markdown_cell("## Report"),
            new_code_cell("summary = sorted(train_xgb)"),
        ],
    )
    assert run_value(out, "rebound", "result['train_xgb'], result['summary']") == (
        "{'total': 5, 'product': 6} ['product', 'total']"
    )
    assert "train_xgb_v1" in (out / "REFACTOR_REPORT.md").read_text()


def test_the_notebooks_own_local_read_before_assignment_is_not_the_refactors(
    tmp_path: Path,
) -> None:
    """`if "experiment" in locals(): experiment.end()` before `experiment = ...` in a function
    (MIT 6.S191's labs): the notebook's own code reads a local before assigning it (`F823`:
    the notebook has a global of that name); in the package the function's module has none,
    and the same read is an `F821`. Both are the notebook's, listed as carried, not counted as
    the refactor's."""
    out = refactored(
        tmp_path,
        "tracker",
        [
            new_markdown_cell("# Tracker\n## Helpers"),
            new_code_cell(
                "def create_experiment(name):\n    if 'experiment' in locals():\n"
                "        experiment.end()\n    experiment = {'name': name}\n    return experiment"
            ),
            new_markdown_cell("## Track"),
            new_code_cell("experiment = create_experiment('first')"),
        ],
    )
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "gate: 0 (" in report
    carried = [line for line in report.splitlines() if line.startswith("- in the package:")]
    assert any("`experiment`" in line for line in carried), report
    assert run_value(out, "tracker", "result['experiment']") == "{'name': 'first'}"


def test_execute_records_a_dicts_key_and_value_types(tmp_path: Path) -> None:
    """A vocabulary passed to a function (deeplearningzerotoall's `char_dic`): with `--execute`
    its parameter is `dict[str, int]` (the tracer recorded no dict's items, so it stayed
    unannotated); a dict whose values differ in type gets no item types from its first one."""
    out = refactored(
        tmp_path,
        "vocab",
        [
            new_markdown_cell("# Vocab\n## Encode"),
            new_code_cell(
                "def encode(text, vocab):\n    return [vocab[c] for c in text]\n\n"
                "def size(stats):\n    return len(stats)"
            ),
            new_code_cell(
                "vocab = {c: i for i, c in enumerate('abc')}\ncodes = encode('cab', vocab)\n"
                "n = size({'a': 1, 'b': 'x'})"
            ),
        ],
        "--execute",
    )
    train = code_of(out, "vocab")
    signatures = [line for text in train.values() for line in text.splitlines()]
    assert any("vocab: dict[str, int]" in line for line in signatures), train
    assert not any("stats: dict[str, int]" in line for line in signatures), train
    assert "mypy on the package: clean" in (out / "REFACTOR_REPORT.md").read_text()


def test_execute_types_a_notebook_that_defines_no_function(tmp_path: Path) -> None:
    """A notebook of top-level code only (deeplearningzerotoall's RNN char-seq): no function of
    its own was called, so the trace held no calls and the types of the notebook's globals it
    recorded were not used at all; the section functions' parameters now get them."""
    out = refactored(
        tmp_path,
        "script",
        [
            new_markdown_cell("# Script\n## Vocabulary"),
            new_code_cell(
                "text = 'hello'\nvocab = {c: i for i, c in enumerate(sorted(set(text)))}"
            ),
            new_markdown_cell("## Encode"),
            new_code_cell("codes = [vocab[c] for c in text]"),
        ],
        "--execute",
    )
    train = code_of(out, "script")["train.py"]
    assert "vocab: dict[str, int]" in train, train
    assert run_value(out, "script", "result['codes']") == "[1, 0, 2, 2, 3]"


def test_a_function_called_after_the_rebinding_reads_the_value(tmp_path: Path) -> None:
    """`def criterion`, then `criterion = lambda ...`, then a function that calls `criterion`,
    called after the rebinding: it runs the lambda, as in the notebook, not the first version
    (a review of the versions change found it ran `criterion_v1`: 5 instead of 25)."""
    out = refactored_clean(
        tmp_path,
        "later",
        [
            new_markdown_cell("## Setup"),
            new_code_cell(
                "def criterion(pred, y):\n    return abs(pred - y)\n"
                "criterion = lambda pred, y: (pred - y) ** 2"
            ),
            new_markdown_cell("## Train"),
            new_code_cell("def train_step(x, y):\n    return criterion(x * 2, y)\n"),
            new_code_cell("loss = train_step(3, 1)"),
        ],
    )
    assert run_value(out, "later", "result['loss']") == "25"


def test_a_statement_that_calls_the_function_and_rebinds_its_name(tmp_path: Path) -> None:
    """`model = model()`: the call is to the function's version, the value keeps the name
    (renaming the target too gave `model_v1 = model_v1()`, an UnboundLocalError)."""
    out = refactored_clean(
        tmp_path,
        "selfcall",
        [
            new_markdown_cell("## Build"),
            new_code_cell("def model():\n    return {'w': 3}\nmodel = model()"),
            new_markdown_cell("## Use"),
            new_code_cell("w = model['w']"),
        ],
    )
    assert run_value(out, "selfcall", "result['model'], result['w']") == "{'w': 3} 3"


def test_a_local_read_before_assignment_elsewhere_hides_no_finding(tmp_path: Path) -> None:
    """The notebook's own F823 on `fractions` in one function does not make a finding of that
    name on another line the notebook's: only the same name on the same line of code is
    carried (a review found a section's `fractions = fractions.Fraction`, an UnboundLocalError
    the refactor then made, counted as carried). The gate on a package written by hand."""
    from refactor import gate
    from refactor.read import read

    notebook = tmp_path / "nb.ipynb"
    helper = (
        "def close():\n    if 'fractions' in locals():\n        fractions.clear()\n"
        "    fractions = None\n    return fractions"
    )
    nbformat.write(new_notebook(cells=[new_code_cell("import fractions\n" + helper)]), notebook)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "utils.py").write_text(helper + "\n")
    (package / "train.py").write_text(
        "import fractions\n\n\ndef build():\n    fractions = fractions.Fraction\n"
        "    return fractions\n"
    )
    found = gate.check(package, read(notebook), set())
    assert [f.where.split(":")[0] for f in found.carried] == ["utils.py"], found
    assert [f.where.split(":")[0] for f in found.introduced] == ["train.py"], found


def test_an_imported_name_a_statement_reads_and_rebinds(tmp_path: Path) -> None:
    """`from tqdm import tqdm`, then `tqdm = partial(tqdm, ...)` (a Colab idiom): the section
    holding the rebinding read its own local `tqdm` before binding it (F823, UnboundLocalError).
    The import is now a version (`tqdm_v1`) up to the rebinding; the value keeps the name."""
    out = refactored_clean(
        tmp_path,
        "tq",
        [
            new_markdown_cell("## Setup"),
            new_code_cell(
                "from functools import partial\nfrom fractions import Fraction\n"
                "half = Fraction(1, 2)\nFraction = partial(Fraction, denominator=4)"
            ),
            new_markdown_cell("## Use"),
            new_code_cell("quarter = float(Fraction(1))"),
        ],
    )
    assert run_value(out, "tq", "float(result['half']), result['quarter']") == "0.5 0.25"
    assert "import Fraction as Fraction_v1" in "".join(code_of(out, "tq").values())
    assert "imported as `Fraction_v1`" in (out / "REFACTOR_REPORT.md").read_text()
