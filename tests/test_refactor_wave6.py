"""`trainmate refactor` on the failure classes a sixth set of real notebooks found (the
training-loop corpora's notebooks, `benchmarks/refactor_corpus6.toml`; BENCHMARKS.md "a sixth
set of real notebooks"): each a small notebook of our own, refactored statically; the package
passes the gate and computes what the notebook computed when run."""

from __future__ import annotations

from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

from tests.test_refactor_wave3 import refactored_clean, run_value


def test_display_which_ipython_gives_a_notebook_is_imported_where_the_package_calls_it(
    tmp_path: Path,
) -> None:
    """ShadmanRohan's speech-command tutorial calls `display(...)` in a helper (IPython puts
    `display` in every notebook's namespace): the helper moved to `utils.py` without it, an
    undefined name that only failed when called (and mypy gave the helper `@no_type_check`).
    A module that calls `display` now imports it from `IPython.display`, and the gate no
    longer takes the notebook's own use for an undefined name."""
    out = refactored_clean(
        tmp_path,
        "shown",
        [
            new_code_cell("import math"),
            new_code_cell("def show(x):\n    display(x)\n    return math.sqrt(x)"),
            new_code_cell("root = show(16)\ndisplay(root)"),
        ],
    )
    assert run_value(out, "shown", "result['root']").splitlines()[-1] == "4.0"
    for module in ("utils", "train"):
        code = (out / "shown" / f"{module}.py").read_text()
        assert "from IPython.display import display" in code, module
    assert "Undefined name `display`" not in (out / "REFACTOR_REPORT.md").read_text()


def test_a_notebook_variable_named_display_is_its_own(tmp_path: Path) -> None:
    """`display = 10` (print every 10 epochs) is the notebook's variable: no module imports
    IPython's `display` over it."""
    out = refactored_clean(
        tmp_path,
        "every",
        [
            new_markdown_cell("## Set up"),
            new_code_cell("display = 10\nsteps = 30"),
            new_markdown_cell("## Train"),
            new_code_cell("shown = [s for s in range(steps) if s % display == 0]"),
        ],
    )
    assert run_value(out, "every", "result['shown']") == "[0, 10, 20]"
    assert "IPython" not in (out / "every" / "train.py").read_text()


def test_an_import_named_as_the_packages_own_config_or_run_is_renamed(tmp_path: Path) -> None:
    """qfettes' DeepRL tutorials: `from utils.hyperparameters import Config`, then `config =
    Config()`. `train.py` imported the notebook's `Config` and the package's own (F811), and
    `run(config: Config)` took the wrong class. The import is now bound as `NotebookConfig`
    (as a notebook definition of `Config` already was), and `from subprocess import run` as
    `run_notebook`."""
    out = refactored_clean(
        tmp_path,
        "named",
        [
            new_markdown_cell("## Set up"),
            new_code_cell("from collections import Counter as Config\nfrom subprocess import run"),
            new_code_cell(
                "config = Config('aab')\n"
                "echoed = run(['echo', 'hi'], capture_output=True, text=True).stdout.strip()"
            ),
            new_code_cell("top = config.most_common(1)[0][0]"),
        ],
    )
    assert run_value(out, "named", "result['top'], result['echoed']") == "a hi"
    code = (out / "named" / "train.py").read_text()
    assert "from collections import Counter as NotebookConfig" in code
    assert "from subprocess import run as run_notebook" in code


def test_a_file_the_notebook_wrote_and_runs_with_run_i_is_inlined(tmp_path: Path) -> None:
    """dvgodoy's PyTorch Step-by-Step: each step is a file the notebook writes (`%%writefile
    model_training/v1.py`) and runs in its namespace (`%run -i model_training/v1.py`). The
    `%run` lines were commented out: the package's sections skipped the data preparation and
    the training. The code of the file, as the notebook wrote it by then, now stands in
    place of the line, and the file itself is not written when it reads the notebook's
    variables (only `%run -i` could run it); a `%run` of a file the notebook did not write
    stays commented."""
    out = refactored_clean(
        tmp_path,
        "steps",
        [
            new_markdown_cell("## Data"),
            new_code_cell("xs = [1.0, 2.0, 3.0]"),
            new_code_cell("%%writefile prep/v1.py\n\ntotal = sum(xs)\nscale = 2.0"),
            new_code_cell("%run -i prep/v1.py"),
            new_markdown_cell("## Train"),
            new_code_cell(
                "%%writefile fit/v1.py\n\nlosses = []\nfor epoch in range(3):\n"
                "    losses.append(total * scale + epoch)"
            ),
            new_code_cell("%run -i fit/v1.py\nlast = losses[-1]"),
            new_code_cell("%%writefile fit/v1.py\n\nlosses = [0.0]"),
            new_code_cell("%run -i fit/v1.py\n%run -i elsewhere/absent.py\ncount = len(losses)"),
        ],
    )
    assert run_value(out, "steps", "result['last'], result['count']") == "14.0 1"
    # only `%run` ran it and it reads the notebook's `xs`: its code stands there, and no copy
    # (a module of undefined names) goes into the package; one that stands alone does
    assert not (out / "prep").exists()
    assert (out / "fit" / "v1.py").read_text().strip() == "losses = [0.0]"
    code = (out / "steps" / "train.py").read_text()
    assert code.count("# notebook: %run -i fit/v1.py (inlined)") == 2
    assert "%run -i elsewhere/absent.py (not converted)" in code
