"""
Which statements only display something: `print(...)`, `display(...)`, `plt.plot(...)`,
`fig, ax = plt.subplots()`, a loop of those. The calls inside may only look (`len`, `.shape`,
`.numpy()`): a statement that runs a model or draws random numbers is not display-only, since
leaving it out would change what the program computes. A section of such statements runs only
with `--plots` (`sections.py`).
"""

from __future__ import annotations

import libcst as cst

from .walk import find

DISPLAY_FUNCS = frozenset({"print", "display", "pprint", "show", "imshow"})
DISPLAY_OWNERS = frozenset({"plt", "sns", "ax", "axes", "axs", "fig", "ipd", "display"})
SAFE_CALLS = frozenset(
    {
        "len", "str", "repr", "type", "round", "format", "sum", "min", "max", "abs", "list",
        "range", "enumerate", "zip", "sorted", "int", "float", "numpy", "cpu", "detach", "item",
        "tolist", "permute", "squeeze", "unsqueeze", "reshape", "view", "mean", "std", "size",
        "dim", "numel", "keys", "values", "items", "head", "tail", "describe", "join", "title",
        "clip", "transpose", "flatten", "count_parameters", "subplots", "figure", "get",
    }
)  # fmt: skip


def is_display(node: cst.BaseStatement) -> bool:
    """Only shows something: `print(...)`, `plt.plot(...)`, `fig, ax = plt.subplots()`, a loop
    of those. Calls inside may only look (`len`, `.shape`, `.numpy()`): no model runs."""
    if isinstance(node, cst.For | cst.With):
        if isinstance(node, cst.For) and (node.orelse is not None or not _only_looks(node.iter)):
            return False
        body = node.body
        if isinstance(body, cst.SimpleStatementSuite):
            return all(_display_small(s) for s in body.body)
        return all(isinstance(s, cst.BaseStatement) and is_display(s) for s in body.body)
    if isinstance(node, cst.SimpleStatementLine):
        return all(_display_small(s) for s in node.body)
    return False


def _display_small(node: cst.BaseSmallStatement) -> bool:
    if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call):
        return _display_call(node.value)
    if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
        func = node.value.func
        return (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "plt"
            and _only_looks(node.value)
        )
    return isinstance(node, cst.Pass)


def _display_call(call: cst.Call) -> bool:
    func = call.func
    if isinstance(func, cst.Name):
        shows = func.value in DISPLAY_FUNCS
    elif isinstance(func, cst.Attribute):
        owner = func.value
        while isinstance(owner, cst.Attribute | cst.Subscript | cst.Call):
            owner = owner.func if isinstance(owner, cst.Call) else owner.value
        shows = isinstance(owner, cst.Name) and (
            owner.value in DISPLAY_OWNERS or func.attr.value in DISPLAY_FUNCS
        )
    else:
        shows = False
    return shows and all(_only_looks(a.value) for a in call.args)


def _only_looks(node: cst.CSTNode) -> bool:
    for call in find(node, cst.Call):
        assert isinstance(call, cst.Call)
        func = call.func
        name = func.value if isinstance(func, cst.Name) else None
        if isinstance(func, cst.Attribute):
            name = func.attr.value
        if name not in SAFE_CALLS and not _display_call(call):
            return False
    return True
