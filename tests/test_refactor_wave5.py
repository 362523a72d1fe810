"""`trainmate refactor` on the failure classes the fifth wave of real notebooks found
(benchmarks/refactor_corpus5.toml, BENCHMARKS.md "A fifth wave of real notebooks"): each a small
notebook of our own, refactored statically; the package passes the gate and computes what the
notebook computed when run, not only on import."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_trainmate.refactor.definite import definitely_bound
from tests.cli_harness import trainmate
from tests.test_refactor_wave3 import refactored_clean, run_value


def test_a_name_bound_in_one_branch_only_is_no_unbound_local(tmp_path: Path) -> None:
    """Colab set-up cells (`if "google.colab" in sys.modules: data_dir = ...`) and optional
    imports (`try: import tensorboardX; logdir = ... except ImportError: pass`): the section
    returned the name, bound on one path only, and the package failed when run with an
    UnboundLocalError (5 of the wave's 31 notebooks). A name a later section reads is None
    first, as absent at the notebook's top level; one nothing reads is not returned."""
    out = refactored_clean(
        tmp_path,
        "branches",
        [
            new_markdown_cell("## Set up"),
            new_code_cell(
                "import sys\n"
                "try:\n    import no_such_module_here\n    logdir = 'runs'\n"
                "except ImportError:\n    pass\n"
                "if 'google.colab' in sys.modules:\n    data_dir = '/content/data'\n"
                "    print(data_dir)\n"
                "mode = 'fast' if len(sys.argv) > 100 else 'slow'"
            ),
            new_markdown_cell("## Use"),
            new_code_cell("where = str(logdir) + '/' + mode"),
        ],
    )
    assert run_value(out, "branches", "result['where']") == "None/slow"
    code = (out / "branches" / "train.py").read_text()
    assert "logdir = None  # bound below on some paths only" in code
    assert "data_dir = None" not in code  # nothing reads it later: not returned


def test_a_name_rebound_under_a_condition_keeps_the_earlier_value_on_the_other_path(
    tmp_path: Path,
) -> None:
    """deepbayes' GAN seminar: an earlier section builds the optimizer, the training section
    rebuilds it only `if restart:`, then steps it. The earlier one was dropped and the section
    read its own local, unbound when `restart` is false: it is now passed in."""
    out = refactored_clean(
        tmp_path,
        "rebind",
        [
            new_markdown_cell("## Build"),
            new_code_cell("steps = []\nopt = 'first'\nrestart = False"),
            new_markdown_cell("## Train"),
            new_code_cell(
                "for i in range(3):\n    if restart:\n        opt = 'second'\n"
                "    steps.append(opt + str(i))"
            ),
        ],
    )
    assert run_value(out, "rebind", "result['steps']") == "['first0', 'first1', 'first2']"


def test_the_type_check_does_not_depend_on_the_folder_the_refactor_runs_from(
    tmp_path: Path,
) -> None:
    """mypy looks for modules in the working folder first: run from a folder holding a folder
    named as a package the notebook imports (a stray `/tmp/gym` in the wave's run), the module
    was that empty namespace package, mypy rejected `gym.make(...)` and the function got
    `@no_type_check`; run from elsewhere it did not."""
    notebook = tmp_path / "where.ipynb"
    nbformat.write(
        new_notebook(
            cells=[
                new_code_cell("import torch\nimport absent_helper_lib"),
                new_code_cell(
                    "def make_batch(n):\n    env = absent_helper_lib.make('toy')\n"
                    "    return torch.zeros(n, 2), env\n\nx, env = make_batch(4)"
                ),
            ]
        ),
        notebook,
    )
    here = tmp_path / "here"
    (here / "absent_helper_lib").mkdir(parents=True)
    out = tmp_path / "out"
    proc = trainmate("refactor", notebook, "-o", out, "--no-docs", cwd=here)
    assert proc.returncode == 0, proc.stderr
    assert "`@no_type_check` on 0 functions" in (out / "REFACTOR_REPORT.md").read_text()


def test_what_top_level_code_binds_on_every_path() -> None:
    code = """
import os
if os.name == "nt":
    a = b = 1
else:
    a = 2
    c = 3
try:
    import json as j
    d = 1
except ImportError:
    d = None
    e = 1
for i in range(3):
    f = i
with open(os.devnull) as g:
    if g.closed:
        raise SystemExit
    h = 1
match a:
    case 1:
        k = 1
    case _:
        k = 2
"""
    assert definitely_bound(code) == {"os", "a", "d", "i", "f", "g", "h", "k"}
    assert definitely_bound("x = (") is None


def test_automagic_and_alias_lines_are_read_as_ipython_runs_them(tmp_path: Path) -> None:
    """deepbayes' sparse VD seminar: `ls -lah | grep _w` in a cell. IPython runs it (`ls` is a
    default alias; with `%automagic`, IPython's default, `pip install x` runs `%pip`), but its
    input transformers leave such lines to the kernel's prefilter, so the refactor refused the
    cell as Python that does not parse. They are escaped as the prefilter would escape them."""
    out = refactored_clean(
        tmp_path,
        "magicless",
        [
            new_code_cell("pip install tqdm==4.66.1\nvalues = [1, 2, 3]"),
            new_code_cell("ls -la | grep x.pt\nls = sorted(values)"),
            new_code_cell("total = sum(ls)"),
        ],
    )
    assert run_value(out, "magicless", "result['total']") == "6"
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "`ls -la | grep x.pt` read as `!ls -la | grep x.pt` (automagic)" in report
    assert "tqdm" in (out / "pyproject.toml").read_text()


def test_an_import_the_notebook_later_redefines_is_read_before_the_definition(
    tmp_path: Path,
) -> None:
    """FilippoMB's diffusion notebook: `from torchvision import transforms`, code that uses it,
    then the notebook's own `def transforms`. The package kept only the definition ("the
    package uses its definition"), so the code before it ran the later function. The import is
    now a version of its own (`sqrt_v1`), read by the statements before the definition and by
    the functions defined before it; the definition keeps the name."""
    out = refactored_clean(
        tmp_path,
        "shadowed",
        [
            new_markdown_cell("## Set up"),
            new_code_cell("from math import sqrt"),
            new_code_cell("def hypot(a, b):\n    return sqrt(a * a + b * b)"),
            new_code_cell("first = sqrt(16.0)\nside = hypot(3.0, 4.0)"),
            new_markdown_cell("## Our own"),
            new_code_cell("def sqrt(x):\n    return x ** 0.5 + 1"),
            new_code_cell("second = sqrt(16.0)"),
        ],
    )
    assert run_value(out, "shadowed", "result['first'], result['side'], result['second']") == (
        "4.0 5.0 5.0"
    )
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "sqrt: imported as `sqrt_v1`" in report
    assert "the package uses its definition" not in report


def test_an_optional_import_of_a_module_mypy_cannot_find_keeps_its_section_checked(
    tmp_path: Path,
) -> None:
    """CSCfi's GTSRB notebook and DTU's VAE exercise: `try: import tensorboardX` in a set-up
    section, read by a later one. The name starts as None (bound on some paths only), and mypy
    took the import of a module it cannot find for a redefinition of that variable: the
    section got `@no_type_check` for code that is fine. The None is now bound out of mypy's
    sight (`if not TYPE_CHECKING:`), the section stays checked and still runs."""
    out = refactored_clean(
        tmp_path,
        "optional",
        [
            new_markdown_cell("## Set up"),
            new_code_cell(
                "steps = 3\ntry:\n    import no_such_tensorboard_module as board\n"
                "except ImportError:\n    pass"
            ),
            new_markdown_cell("## Use"),
            new_code_cell("logged = board is not None\ntotal = steps * 2"),
        ],
    )
    assert run_value(out, "optional", "result['logged'], result['total']") == "False 6"
    code = (out / "optional" / "train.py").read_text()
    assert "@no_type_check" not in code
    assert "if not TYPE_CHECKING:  # bound below on some paths only" in code
    assert "`@no_type_check` on 0 functions" in (out / "REFACTOR_REPORT.md").read_text()
