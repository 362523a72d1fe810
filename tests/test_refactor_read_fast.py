"""`read.transform_cell` skips IPython's token transforms for a cell that parses as Python once
cleaned up; it must give IPython's `TransformerManager.transform_cell` text for every cell,
Python or not (the measured corpora's 2,869 code cells all agree: BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from jupyter_trainmate.refactor.read import transform_cell

CELLS = [
    "x = 1",
    "\n\n  \nx = 1\n",  # leading blank lines: removed
    "def f():\n    a = 1\n    \n    return a\n",  # a whitespace-only line: emptied
    "    # an indented comment first\n    x = 1\n",  # common indentation: removed
    "x = ...\n...\n",  # Ellipsis, not a prompt
    ">>> x = 1\n>>> x + 1\n",  # doctest prompts: stripped
    "In [1]: x = 1\n",  # IPython prompt
    "x = (1\n     / 2)\n",  # a continuation line starting with an operator
    "%matplotlib inline\nimport torch\n",
    "!pip install -q tqdm\nx = 1",
    "files = !ls\nt = %time sum([1])\n",
    "len?\n",
    "x = '%not a magic'  # what?\n",
    "s = '''\n>>> inside a string\n'''\n",
    "def broken(:\n    pass\n",  # IPython's text too (the parse step reports it)
    "x = 1\r\ny = 2\r\n",
    "if True:\n\tx = 1\n",
]


@pytest.mark.parametrize("source", CELLS)
def test_same_text_as_ipython(source: str) -> None:
    manager = TransformerManager()
    assert transform_cell(manager, source) == manager.transform_cell(source)


def test_same_text_on_every_cell_of_our_notebooks() -> None:
    manager = TransformerManager()
    root = Path(__file__).parent.parent
    count = 0
    for path in [*root.glob("notebooks/*.ipynb"), *root.glob("tests/notebooks/*.ipynb")]:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
                continue
            count += 1
            assert transform_cell(manager, cell.source) == manager.transform_cell(cell.source), (
                f"{path.name}: {cell.source[:80]!r}"
            )
    assert count > 100
