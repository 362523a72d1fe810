"""Types from mypy's own inference (`refactor/mypytypes.py`): where the static engine's table of
library calls has no entry (`np.unique`, a dict of tensors, a section's output it could not
type), the types mypy gave the clean package's expressions go in, checked by the next round;
never for a function whose calls mypy does not all see."""

from __future__ import annotations

import ast
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

from tests.test_refactor_wave3 import refactored_clean, run_value


def _signatures(path: Path) -> dict[str, dict[str, str | None]]:
    """Each function's parameters (and "return") as annotated in `path`, None where not."""
    found: dict[str, dict[str, str | None]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            params = {
                a.arg: ast.unparse(a.annotation) if a.annotation is not None else None
                for a in [*node.args.args, *node.args.kwonlyargs]
            }
            params["return"] = ast.unparse(node.returns) if node.returns is not None else None
            found[node.name] = params
    return found


def test_types_the_static_table_lacks_come_from_mypy(tmp_path: Path) -> None:
    out = refactored_clean(
        tmp_path,
        "mypyinf",
        [
            new_code_cell("import numpy as np\nimport torch\nfrom torch import nn"),
            new_markdown_cell("## Data"),
            new_code_cell("sizes = np.unique(np.geomspace(2, 300, 20, dtype=int))"),
            new_code_cell(
                "def count(values):\n    return len(values)\n\n"
                "def norm(vector):\n    return float(vector.norm())\n\n"
                "def passed_on(items):\n    return items"
            ),
            new_markdown_cell("## Train"),
            new_code_cell(
                "torch.manual_seed(0)\nmodel = nn.Linear(3, 2)\nn = count(sizes)\n"
                "flat = torch.nn.utils.parameters_to_vector(model.parameters())\n"
                'size = norm(flat)\nkept = passed_on(sizes)\nhandlers = {"items": passed_on}'
            ),
            new_code_cell("total = n + round(size, 3)"),
        ],
    )
    # the package computes what the notebook computed
    assert run_value(out, "mypyinf", "result['n']") == "19"  # 2, 2.6, ... as ints, once each
    package = out / "mypyinf"
    signatures = {}
    for module in package.glob("*.py"):
        signatures.update(_signatures(module))
    # `np.unique` and `parameters_to_vector` are in no table of the static engine; mypy knows
    # what they give: the section's output first, then (the next time mypy's types are read)
    # the parameter it is passed to
    assert signatures["load_data"]["return"] == "np.ndarray"
    # (in `data.py`, which imports neither library, by a name imported for the annotations)
    assert signatures["count"]["values"] == "ndarray"
    assert signatures["norm"]["vector"] == "Tensor"
    # a function also passed on as a value may be called with anything: its one call mypy
    # typed says nothing of the others
    assert signatures["passed_on"]["items"] is None
    report = (out / "REFACTOR_REPORT.md").read_text()
    assert "annotations come from mypy's own inference" in report
    assert "mypy on the package: clean." in report
