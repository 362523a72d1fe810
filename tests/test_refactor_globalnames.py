"""What `analyze` says each top-level statement reads from the notebook's globals, now from
CPython's `symtable` over `ast` (`refactor/globalnames.py`) instead of libcst's scope provider:
Python's scoping rules, the order the packages' parameters follow, and the two answers that
changed (an import a statement makes itself is not a read of it; `global n; n += 1` reads `n`)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_trainmate.refactor.analyze import Item, analyze
from jupyter_trainmate.refactor.read import read


def items(tmp_path: Path, *cells: str) -> dict[str, Item]:
    path = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]), path)
    found = analyze(read(path)).items
    return {item.name or f"{item.cell}:{item.line}": item for item in found}


def test_scopes_follow_python(tmp_path: Path) -> None:
    got = items(
        tmp_path,
        "import torch\nscale = 2\nx = 1",
        "class Box:\n"
        "    x = 5\n"  # a class body's name: not seen by its methods, which read the global x
        "    y = x + 1\n"
        "    def get(self):\n        return x\n"
        "    zs = [x for _ in range(3)]\n",  # a comprehension in a class body: the global x too
        "def bump():\n    global counter\n    counter += scale\n",
        "def outer():\n    k = 1\n    def inner():\n        nonlocal k\n        k += w\n    return inner",
        "total = 0\nfor v in [1, 2]:\n    total += v * scale\n",
        "squares = [(n := i) * i for i in range(x)]\nlast = n",
        "fn = lambda a, b=scale: a + torch.zeros(b)",
    )
    assert got["Box"].reads == ("x",)
    assert got["bump"].reads == ("counter", "scale")  # libcst's provider missed `counter`
    assert got["bump"].declares == ("counter",)
    assert got["outer"].reads == ("w",)
    total = next(i for i in got.values() if "total" in i.binds and i.kind == "statement")
    assert total.reads == ("total", "scale")  # bound by the statement before
    comprehension = next(i for i in got.values() if "squares" in i.binds)
    assert comprehension.reads == ("x",)
    last = next(i for i in got.values() if i.binds == ("last",))
    assert last.reads == ("n",)
    lam = next(i for i in got.values() if i.binds == ("fn",))
    assert lam.reads == ("scale", "torch")


def test_order_of_a_class_reads_is_libcst_s(tmp_path: Path) -> None:
    """The last method's names first, then the earlier ones; then the bases: the order the
    libcst provider gave, which the parameters of the written package follow."""
    got = items(
        tmp_path,
        "import torch\nfrom torch import nn\nimport torch.nn.functional as F\nwidth = 4\ndepth = 2",
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super(Net, self).__init__()\n"
        "        self.fc = nn.Linear(width, width)\n"
        "    def forward(self, x):\n"
        "        return F.relu(self.fc(x)) * depth + torch.ones(1)\n",
        "def make():\n    a = [width for _ in range(2)]\n    return lambda: depth + a[0]\n",
    )
    assert got["Net"].reads == ("F", "depth", "torch", "Net", "nn", "width")
    assert got["Net"].at_definition == ("nn",)
    assert got["make"].reads == ("depth", "width")  # the lambda's scope is met first


def test_reads_that_changed_with_symtable(tmp_path: Path) -> None:
    got = items(
        tmp_path,
        "try:\n    import requests\n    r = requests.get('u')\nexcept ImportError:\n    pass",
        "import os.path\nhere = os.path.join('a', 'b')",
        "import os.path\ndef where():\n    return os.path.join('a', 'b')",
    )
    tried = next(i for i in got.values() if "requests" in i.binds)
    assert tried.reads == ()  # it imports `requests` before it uses it
    here = next(i for i in got.values() if i.binds == ("here",))
    assert here.reads == ("os",)
    assert got["where"].reads == ("os",)


def test_a_global_statement_last_in_its_function(tmp_path: Path) -> None:
    got = items(
        tmp_path,
        "def first():\n    x = 1\n    global late\n",
        "def second():\n    return 1\n",
        "if True:\n    global top\n    top = 1\n",
    )
    assert got["first"].declares == ("late",)
    assert got["second"].declares == ()
    top = next(i for i in got.values() if i.binds == ("top",))
    assert top.declares == ("top",)


def test_item_text_is_the_statement_as_written(tmp_path: Path) -> None:
    """`Item.text` (what `params.hard_coded_device` reads before it walks a statement)."""
    from jupyter_trainmate.refactor.params import hard_coded_device

    got = items(
        tmp_path,
        "import torch\n\n@torch.no_grad()\ndef move(x):\n    return x.cuda()\n",
        "a = 1; b = 'cuda:0'\nc = 2",
        "if __name__ == '__main__':\n    d = torch.ones(2).to('cpu')\n",
    )
    assert got["move"].text == "@torch.no_grad()\ndef move(x):\n    return x.cuda()\n"
    assert hard_coded_device(got["move"])
    pair = next(i for i in got.values() if i.binds == ("a", "b"))
    assert pair.text == "a = 1; b = 'cuda:0'\n"
    assert hard_coded_device(pair)
    opened = next(i for i in got.values() if i.binds == ("d",))
    assert opened.text == "    d = torch.ones(2).to('cpu')\n"
    assert not hard_coded_device(opened)


MODULE = '''"""Doc."""
import torch, os as o
from x import (a,
    b as c)


@decorate(  a )
class Net(torch.nn.Module):
    def forward(self, x: "torch.Tensor", *, n: int = (3)) -> ((torch.Tensor)):
        return x


# a comment
total = 0; more = 1
for i in range(3): total += i  # a comment
@first
@second(1)
def f(): return 1
if __name__ == "__main__":
    try:
        del total
    finally:
        with open("f") as fh, open("g"): pass
while False:
    break
'''


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_item_lines_are_position_providers(tmp_path: Path, newline: str) -> None:
    """Where analyze says each statement starts (from the ast) is where libcst's
    `PositionProvider` starts it (a decorated definition: its `def` or `class` line)."""
    import libcst as cst
    from libcst.metadata import PositionProvider

    text = MODULE.replace("\n", newline)
    got = list(items(tmp_path, text).values())
    module = cst.parse_module(text)
    positions = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    expected = []
    for statement in module.body:
        if isinstance(statement, cst.If):  # the opened `__main__` gate: its body's statements
            assert isinstance(statement.body, cst.IndentedBlock)
            expected += [positions[s].start.line for s in statement.body.body]
        else:
            expected.append(positions[statement].start.line)
    assert [i.line for i in got] == expected
    assert expected[3:5] == [8, 14]  # the class's `class` line; `total = 0; more = 1`


def test_cases_a_review_found(tmp_path: Path) -> None:
    """Two scopes of a kind on one line get their own symbol tables (CPython makes a
    comprehension's first iterable's, and a lambda's defaults', first); a class body reading a
    global it then binds reads the global; cells CPython refuses only as one module; lines
    as `ast` counts them; only the top-level `__main__` gate is opened; a comprehension's own
    `:=` is not a read."""
    got = items(
        tmp_path,
        "r = [f(a) for a in [g(b) for b in xs]]",
        "total = sum(len(s) for s in (t.split() for t in lines))",
        "d = {tuple(a for a in k): sum(b * w for b in v) for k, v in items}",
        "q = [[c for c in a] for a in [b for b in ys]]",
        "h = lambda a=(lambda: A): (lambda: a + B)",
        "class Config:\n    lr = lr\n    y = x\n    x = 2\n",
        "sep = 'a\u2028b'\nmodel = Net().cuda()",
        "if __name__ == '__main__':\n    if __name__ == '__main__':\n        inner = 1\n    outer = 2",
        "zs = [z for x in xs if (z := f(x))]",
    )
    by_binds = {i.binds: i for i in got.values()}
    assert by_binds[("r",)].reads == ("f", "g", "xs")
    assert by_binds[("total",)].reads == ("lines",)
    assert by_binds[("d",)].reads == ("w", "items")
    assert by_binds[("q",)].reads == ("ys",)
    assert by_binds[("h",)].reads == ("A", "B")
    assert got["Config"].reads == ("lr", "x")
    model = next(i for i in got.values() if "model" in i.binds)
    assert model.text.endswith("model = Net().cuda()\n")
    assert by_binds[("outer",)].line == 4
    assert type(by_binds[("inner",)].node).__name__ == "If"  # the inner gate stays as it is
    assert by_binds[("zs", "z")].reads == ("xs", "f")  # `:=` binds `z` at the top level


def test_cells_python_refuses_only_as_one_module(tmp_path: Path) -> None:
    """`x = 1` then, in a later cell, `global x` at the top level: each cell compiles, the two
    together do not ("assigned to before global declaration"); such a `global` does nothing,
    and the cells are analysed, none refused."""
    path = tmp_path / "nb.ipynb"
    cells = ["x = 1", "global x\nx = 2\ny = x + 1", "print(z)", "global z"]
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in cells]), path)
    analysis = analyze(read(path))
    assert analysis.bad == []
    assert [i.binds for i in analysis.items] == [("x",), (), ("x",), ("y",), (), ()]
    assert analysis.items[3].reads == ("x",)
