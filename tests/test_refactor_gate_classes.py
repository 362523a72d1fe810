"""`trainmate refactor` on the classes of undefined names (`F821`) the real-notebook corpus still
showed on main (BENCHMARKS.md, "The whole corpus on main after the torchrun wiring"): each a
small notebook of our own, refactored statically; the package passes the gate (`ruff check
--select E9,F63,F7,F82,F811`, the refactor's own and the same command here) and its modules import
quietly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from refactor.output import ruff
from tests.test_refactor_dataflow import code_of, imports_quietly, trainmate

GATE = "E9,F63,F7,F82,F811"


def refactored(
    tmp_path: Path, name: str, cells: list[nbformat.NotebookNode], *options: str
) -> Path:
    notebook = tmp_path / f"{name}.ipynb"
    nbformat.write(new_notebook(cells=cells), notebook)
    out = tmp_path / "out"
    proc = trainmate("refactor", notebook, "-o", out, "--no-docs", *options)
    assert proc.returncode == 0, proc.stderr
    return out


def gate_findings(out: Path) -> list[str]:
    """The gate on everything the refactor wrote (the package and the notebook's own files)."""
    proc = subprocess.run(
        [ruff(), "check", "--isolated", "--no-cache", "--select", GATE, "--output-format",
         "json", "--exit-zero", "."],
        cwd=out, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [f"{f['filename']}: {f['code']} {f['message']}" for f in json.loads(proc.stdout)]


def test_an_exception_name_is_not_state_after_its_handler(tmp_path: Path) -> None:
    """`except Exception as ex:` binds `ex` only inside the handler (Python deletes it there):
    the section function must not return it (DTU 7.2's `ex`, an F821 in `return ..., ex`)."""
    out = refactored(
        tmp_path,
        "handler",
        [
            new_markdown_cell("# Handler\n## Setup"),
            new_code_cell(
                "try:\n    from fractions import Fraction\nexcept Exception as ex:\n"
                "    print(ex)\nhalf = Fraction(1, 2)"
            ),
            new_code_cell("value = float(half) * 2"),
        ],
    )
    assert gate_findings(out) == []
    assert "gate: 0 (" in (out / "REFACTOR_REPORT.md").read_text()
    train = code_of(out, "handler")["train.py"]
    assert "ex, " not in train
    assert ", ex" not in train
    for module in code_of(out, "handler"):
        imports_quietly(out, "handler", module.removesuffix(".py"), tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", "from handler.train import run; from handler.config import "
         "Config; print(run(Config())['value'])"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "1.0\n"), run.stderr


def test_a_written_python_file_gets_the_notebook_imports_it_reads(tmp_path: Path) -> None:
    """A `%%writefile` script the notebook runs with `%run -i` reads the notebook's imports
    (PyTorchStepByStep 2.1's `model_configuration/v4.py` reads `torch`, `nn`, `optim`): the
    package's copy imports them itself, and the rest of it is as the notebook wrote it."""
    body = "rate = Fr(1, 4)\nangle = math.pi * float(rate)\n"
    out = refactored(
        tmp_path,
        "written",
        [
            new_markdown_cell("# Written\n## Setup"),
            new_code_cell("import math\nimport os\nfrom fractions import Fraction as Fr"),
            new_code_cell(f"%%writefile settings/v1.py\n{body}"),
            new_code_cell("%%writefile settings/notes.txt\nrate = Fr(1, 4)\n"),
            new_code_cell("%run -i settings/v1.py"),
            new_code_cell("value = math.cos(0.0) + len(os.sep)"),
        ],
    )
    assert gate_findings(out) == []
    written = (out / "settings" / "v1.py").read_text()
    assert written.endswith("import math\nfrom fractions import Fraction as Fr\n\n" + body)
    assert "import os" not in written  # only what the file reads
    assert (out / "settings" / "notes.txt").read_text() == "rate = Fr(1, 4)\n"  # not Python
    run = subprocess.run(
        [sys.executable, "-c", "exec(open('settings/v1.py').read()); print(angle)"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "0.7853981633974483\n"), run.stderr


def test_a_name_deleted_in_its_own_section_is_not_returned(tmp_path: Path) -> None:
    """`df = pd.read_csv(...)`, `df.head()`, then `del df` (stat453 L15's F821 `df` in
    `return df`): the section ends without it, and the sections after it still get theirs."""
    out = refactored(
        tmp_path,
        "deleted",
        [
            new_markdown_cell("# Deleted\n## Data"),
            new_code_cell("rows = sorted([3, 1, 2])\nrows[:2]"),
            new_code_cell("del rows"),
            new_code_cell("kept = sorted([2, 1])\ndel kept\nkept = [0]"),
            new_markdown_cell("## Model"),
            new_code_cell("weights = [0.5, 0.25]\ntotal = sum(weights) + len(kept)"),
        ],
    )
    assert gate_findings(out) == []
    assert "gate: 0 (" in (out / "REFACTOR_REPORT.md").read_text()
    train = code_of(out, "deleted")["train.py"]
    assert "return rows" not in train
    run = subprocess.run(
        [sys.executable, "-c", "from deleted.train import run; from deleted.config import "
         "Config; print(sorted(run(Config())))"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (0, "['kept', 'total']\n"), run.stderr


def test_calls_with_star_args_still_pass_the_keyword_only_state(tmp_path: Path) -> None:
    """`train(net, *data, num_epochs, ...)` (Dive into DL's 3.16 `k_fold`, and d2l-pytorch's
    copy): the callee gains `loss` as a keyword-only parameter, and a `*args` at the call fills
    no keyword-only parameter, nor does a `**kwargs` (its keys were the callee's own
    parameters). The call sites passed none, so the package raised `TypeError` on the first
    call, and mypy's "Missing named argument" led the refactor to drop annotations over it
    instead of showing it."""
    out = refactored(
        tmp_path,
        "star",
        [
            new_markdown_cell("# Star\n## Setup"),
            new_code_cell("def make_scale():\n    return 3.0\nscale = make_scale()"),
            new_code_cell("def fit(a, b, epochs):\n    return (a + b) * scale * epochs"),
            new_code_cell("def k_fold(data, epochs):\n    return fit(*data, epochs)"),
            new_code_cell("result = k_fold((1, 2), 4)\nprint(result)"),
            new_code_cell("cfg = dict(a=1, b=2, epochs=2)\nprint(fit(**cfg))"),
        ],
    )
    assert "return fit(*data, epochs, scale=scale)" in code_of(out, "star")["utils.py"]
    assert "print(fit(**cfg, scale=scale))" in code_of(out, "star")["train.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "star", "train"], cwd=out, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["36.0", "18.0"]
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "mypy on the package: clean." in report
    assert "mypy rejected were removed" not in report


def test_constants_that_differ_only_in_case_stay_two_hyperparameters(tmp_path: Path) -> None:
    """`gamma = 0.99` and `GAMMA = 0.5` (and `BATCH_SIZE` next to `batch_size`), as the
    500-cell notebook of real cells has them: `Config` had one field for both, so the package
    computed with one value where the notebook used two (and mypy's "already defined" was all
    that showed it). Each now keeps its own name where the lower case is another's."""
    out = refactored(
        tmp_path,
        "cases",
        [
            new_markdown_cell("# Cases\n## Setup"),
            new_code_cell("gamma = 0.99\nGAMMA = 0.5\nBATCH_SIZE = 64\nbatch_size = 8\nLR = 0.1"),
            new_code_cell("def discount(r):\n    return r * gamma + GAMMA"),
            new_code_cell("print(discount(1.0), BATCH_SIZE, batch_size, LR)"),
        ],
    )
    config = code_of(out, "cases")["config.py"]
    fields = ("gamma = gamma", "GAMMA = GAMMA", "lr = LR", "BATCH_SIZE = BATCH_SIZE")
    for field in (*fields, "batch_size = batch_size"):
        name, _, value = field.partition(" = ")
        assert re.search(rf"^    {name}: \w+ = {value}$", config, re.M), field

    def run(*options: str) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "cases", "train", *options],
            cwd=out, capture_output=True, text=True,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert run() == ["1.49", "64", "8", "0.1"]  # as the notebook prints them
    assert run("--GAMMA", "0.25", "--batch-size", "4", "--lr", "0.2") == ["1.24", "64", "4", "0.2"]
    assert "mypy on the package: clean." in (out / "REFACTOR_REPORT.md").read_text()


def test_a_refused_cell_keeps_its_imports_for_the_cells_after_it(tmp_path: Path) -> None:
    """Exercise notebooks (Practical RL's week 4, and more of the second corpus): a cell with
    a `<YOUR CODE>` placeholder does not parse and `--skip-bad-cells` refuses it, and with it
    the `import matplotlib.pyplot as plt` it starts with, so every later `plt` was an undefined
    name (mypy's error, functions decorated). Its one-line imports are kept, and with
    `--execute` they run in the traced notebook (its later cells failed there before)."""
    cells = [
        new_markdown_cell("# Exercise\n## Setup"),
        new_code_cell("import json\nfrom math import sqrt\n\nanswer = <YOUR CODE>\nprint(answer)"),
        new_code_cell("def root(v):\n    return sqrt(v)\nprint(json.dumps([root(4.0)]))"),
    ]
    out = refactored(tmp_path, "exercise", cells, "--skip-bad-cells", "--execute")
    assert gate_findings(out) == []
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "its imports are kept: `import json`, `from math import sqrt`" in report
    assert "answer" not in code_of(out, "exercise")["train.py"]
    assert "def root(v: float) -> float:" in code_of(out, "exercise")["utils.py"]  # traced
    run = subprocess.run(
        [sys.executable, "-m", "exercise", "train"], cwd=out, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[2.0]"]


def test_the_imports_a_refused_cell_keeps_stay_on_their_lines(tmp_path: Path) -> None:
    """Only a line that starts a statement is an import: not one inside a string spanning
    lines, nor one inside brackets; each keeps its line (the report's notes name it)."""
    from refactor.analyze import analyze
    from refactor.read import read

    notebook = tmp_path / "lines.ipynb"
    source = (
        'x = 1\nHELP = """\nfrom nowhere import thing\n"""\nimport json\nanswer = <YOUR CODE>\n'
        "from math import (sqrt,\n    pi)\nimport os"
    )
    nbformat.write(new_notebook(cells=[new_code_cell(source)]), notebook)
    analysis = analyze(read(notebook))
    assert [b.kept for b in analysis.bad] == [("import json", "import os")]
    assert [(item.line, item.kind) for item in analysis.items] == [(5, "import"), (9, "import")]
    # a cell that does not even tokenize (a dedent to no outer level): the lines before it count
    nbformat.write(
        new_notebook(
            cells=[new_code_cell("import json\nif x:\n        a = 1\n    b = 2\nimport os")]
        ),
        notebook,
    )
    assert [b.kept for b in analyze(read(notebook)).bad] == [("import json",)]
