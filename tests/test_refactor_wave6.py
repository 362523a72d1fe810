"""`trainmate refactor` on the failure classes a sixth set of real notebooks found (the
training-loop corpora's notebooks, `benchmarks/loops_corpus*.toml`, refactored: BENCHMARKS.md
"A sixth set of real notebooks"): each a small notebook of our own, refactored statically;
the package passes the gate and computes what the notebook computed when run."""

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
