"""`trainmate refactor` on the failure classes found in the twenty-second session: an assignment
expression (`:=`) at a notebook's top level, a `def` or `class` in one branch only, the lines
reported after an inlined `%run` and in a `%%train` cell, and what ruff left in small packages.
Each a small notebook of our own, refactored statically; each test fails before its fix."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_trainmate.refactor.pipeline import package_name
from tests.cli_harness import trainmate
from tests.test_refactor_gate_classes import refactored
from tests.test_refactor_wave3 import clean, refactored_clean, run_value


def test_a_name_bound_by_an_assignment_expression_is_passed_on(tmp_path: Path) -> None:
    """`if (m := pattern.match(line)):` and `[last := f(x) for x in xs]` at a notebook's top
    level bind `m` and `last` there. The analysis did not see `:=` as a binding: the section
    that binds them did not return them, and the later section that reads them failed with a
    NameError (three F821 in the gate). A walrus in an `if` test binds on every path; one in a
    branch only starts as None."""
    out = refactored_clean(
        tmp_path,
        "walrus",
        [
            new_markdown_cell("## Parse"),
            new_code_cell(
                "import re\n"
                "if (found := re.match(r'(\\d+)', '42 epochs')):\n    pass\n"
                "if len('ab') > 5:\n    if (rare := 3):\n        pass\n"
                "squares = [last := n * n for n in range(4)]"
            ),
            new_markdown_cell("## Use"),
            new_code_cell("epochs = int(found.group(1)) + last\nnone_yet = rare is None"),
        ],
    )
    assert run_value(out, "walrus", "result['epochs'], result['none_yet']") == "51 True"
    code = (out / "walrus" / "train.py").read_text()
    assert "rare = None  # bound below on some paths only" in code
    assert "found = None" not in code
    assert "last = None" not in code


def test_a_def_or_class_in_one_branch_only_keeps_its_section_checked(tmp_path: Path) -> None:
    """A `def` or `class` in one branch only (`if USE_CUDA: class Loader: ...`) started as
    `Loader = None` before the branch, which mypy calls a redefinition ("Name already
    defined"): the section got `@no_type_check`. It starts out of mypy's sight now, as an
    optional import does; a name an assignment binds on some paths only starts as a plain
    None again, so the sections after it keep its type (`int | None`), where `Any` lost it."""
    out = refactored_clean(
        tmp_path,
        "branchdefs",
        [
            new_markdown_cell("## Set up"),
            new_code_cell(
                "import sys\n"
                "if len(sys.argv) < 100:\n"
                "    class Scaler:\n        factor = 3\n"
                "    def double(x):\n        return 2 * x\n"
                "    size = 4"
            ),
            new_markdown_cell("## Use"),
            new_code_cell("value = double(size) * Scaler.factor"),
        ],
    )
    assert run_value(out, "branchdefs", "result['value']") == "24"
    code = (out / "branchdefs" / "train.py").read_text()
    assert "no_type_check" not in code
    assert "    Scaler: Any = None" in code
    assert "    double: Any = None" in code
    assert "size = None  # bound below on some paths only" in code
    assert "size: int | None" in code  # the next section's parameter keeps its type


def test_lines_after_an_inlined_run_and_in_a_train_cell_are_the_cells_own(
    tmp_path: Path,
) -> None:
    """An inlined `%run` puts the file's lines in place of one line: what came after it was
    reported that many lines further down (the notebook's own undefined name on "line 9" of
    a four-line cell), and the lines of a `%%train` cell's body one line up."""
    out = refactored(
        tmp_path,
        "lines",
        [
            new_markdown_cell("# Lines"),
            new_code_cell("xs = [1.0, 2.0]"),
            new_code_cell("%%writefile prep/v1.py\n\ntotal = sum(xs)\nscale = 2.0\nshift = 1.0"),
            new_code_cell("%run -i prep/v1.py\n%run -i prep/v1.py\nprint(undefined_one)"),
            new_code_cell("%%train\n%run -i prep/v1.py\nprint(undefined_two)\nsteps = 2"),
        ],
    )
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "- cell 4, line 3: F821 Undefined name `undefined_one`" in report
    assert "- cell 5, line 3: F821 Undefined name `undefined_two`" in report
    assert "- cell 5, line 2: kept: `%run -i prep/v1.py`" in report


def test_a_package_without_a_training_loop_leaves_ruff_nothing(tmp_path: Path) -> None:
    """A notebook with no training loop: `__main__.py` named the `train` command's parser for
    options it never added (F841), and an `if TYPE_CHECKING:` block whose imports ruff removed
    stayed as `pass` (13 of 203 corpus packages)."""
    out = refactored_clean(
        tmp_path,
        "quiet",
        [
            new_markdown_cell("## Count"),
            new_code_cell("import sys\nif (n := len(sys.argv)) > 100:\n    pass\nm = n + 1"),
        ],
    )
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "`ruff check`: clean" in report
    for path in (out / "quiet").glob("*.py"):
        assert "if TYPE_CHECKING:\n    pass" not in path.read_text(), path


def test_a_notebook_named_in_other_letters_gets_an_ascii_package(tmp_path: Path) -> None:
    """boyu-ai's Hands-on-RL (`第7章-DQN算法.ipynb`): the package was named `第7章_dqn算法`,
    which no distribution may be called (PEP 508), and `pyproject.toml` wrote it as a bare
    TOML key, which is invalid. ruff could not read its configuration, so nothing was
    formatted or fixed (60 F811 in the gate), and pytest refused to start. The name is ASCII
    now, with a hash of the file name for the letters it drops; accents become their letter."""
    import tomllib

    notebook = tmp_path / "第7章-DQN算法.ipynb"
    cells = [new_code_cell("hidden_dim = 8\nbatch_size = 4"), new_code_cell(
        "class Net:\n    def __init__(self, hidden_dim):\n        self.h = hidden_dim\n"
        "net = Net(hidden_dim)\nsize = net.h * batch_size"
    )]  # fmt: skip
    nbformat.write(new_notebook(cells=cells), notebook)
    out = tmp_path / "out"
    proc = trainmate("refactor", notebook, "-o", out, "--no-docs")
    assert proc.returncode == 0, proc.stderr
    (package,) = [p.name for p in out.iterdir() if (p / "__init__.py").is_file()]
    assert package.startswith("nb_7_dqn_")
    assert package.isascii()
    assert package.isidentifier()
    config = tomllib.loads((out / "pyproject.toml").read_text())
    assert config["project"]["name"] == package
    clean(out, package, tmp_path)
    assert run_value(out, package, "result['size']") == "32"
    assert "`ruff check`: clean" in (out / "REFACTOR_REPORT.md").read_text()
    assert package_name(Path("Réseau de neurones.ipynb"), None) == "reseau_de_neurones"


def test_a_module_imported_on_one_path_then_at_the_top_level_is_that_module(
    tmp_path: Path,
) -> None:
    """MMIV's MedNIST notebook: `if not colab: import sys` in a set-up cell, and later `import
    sys` with `sys.path.append("../")` before `from cm_utils import ...`. The later import was
    lost: the set-up section returned its `sys` (None on the colab path) and passed it on. It
    is the module everywhere now; `cm_utils`, found through the notebook's `sys.path`, is its
    own module (no dependency), and IPython 9's removed `set_matplotlib_formats` comes from
    where IPython said to import it."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper_mod.py").write_text("def plot_cm(x):\n    return x * 2\n")
    out = refactored(
        tmp_path,
        "condsys",
        [
            new_markdown_cell("# Condsys"),
            new_markdown_cell("## Set up"),
            new_code_cell("colab = False\nif colab:\n    import sys\n    !pip install foo"),
            new_markdown_cell("## Use"),
            new_code_cell("import sys\nsys.path.append('lib')\nfrom helper_mod import plot_cm"),
            new_code_cell("argv_count = plot_cm(len(sys.argv))"),
        ],
    )
    # as the report says: the notebook's own module goes beside pyproject.toml
    (out / "helper_mod.py").write_text((tmp_path / "lib" / "helper_mod.py").read_text())
    clean(out, "condsys", tmp_path)
    assert run_value(out, "condsys", "result['argv_count'] >= 2") == "True"
    code = (out / "condsys" / "train.py").read_text()
    assert "import sys\n" in code
    assert "sys = None" not in code
    assert "sys: Any" not in code
    assert '"helper-mod"' not in (out / "pyproject.toml").read_text()
    assert '"helper_mod"' not in (out / "pyproject.toml").read_text()
    assert (
        "- not `helper_mod`: the notebook's own module" in (out / "REFACTOR_REPORT.md").read_text()
    )


def test_set_matplotlib_formats_comes_from_matplotlib_inline(tmp_path: Path) -> None:
    """EdwardRaff's Inside Deep Learning: `from IPython.display import set_matplotlib_formats`
    fails on IPython 9 (ImportError on importing the package's module)."""
    out = refactored(
        tmp_path,
        "formats",
        [
            new_code_cell(
                "%matplotlib inline\nfrom IPython.display import set_matplotlib_formats\n"
                "set_matplotlib_formats('png', 'pdf')"
            ),
            new_code_cell("total = sum(range(4))"),
        ],
    )
    code = (out / "formats" / "train.py").read_text()
    assert "from matplotlib_inline.backend_inline import set_matplotlib_formats\n" in code
    assert "IPython.display" not in code
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "`set_matplotlib_formats` imported from `matplotlib_inline.backend_inline`" in report


def test_a_class_defined_in_a_section_is_no_annotation(tmp_path: Path) -> None:
    """dataflowr's collaborative filtering: a class defined under an `if` is local to its
    section function, and mypy names its instances `Box@18`. Filling the `Any` items of the
    section's returned tuple from mypy's reading wrote `tuple[Box @ 18, ...]` (F821). A class
    no name reaches stays `Any`; the other items are filled."""
    out = refactored_clean(
        tmp_path,
        "localclass",
        [
            new_markdown_cell("## Build"),
            new_code_cell(
                "import json\nif len('ab') < 5:\n    class Box:\n        def __init__(self):\n"
                "            self.v = 1\nbox = Box()\nloaded = json.loads('[1, 2]')\n"
                "names = ['a'] + [str(x) for x in loaded]"
            ),
            new_markdown_cell("## Use"),
            new_code_cell("total = box.v + len(names)"),
        ],
    )
    assert run_value(out, "localclass", "result['total']") == "4"
    code = (out / "localclass" / "train.py").read_text()
    assert "def build() -> tuple[Any, list[str], Any]:" in code
