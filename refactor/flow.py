"""
Pure type rules the scopes use: the type of a literal, of an arithmetic result, of an item of a
tuple, and which statements of a function are its own and whether its body can run off its end.
"""

from __future__ import annotations

import ast
import functools

from .symbols import FunctionNode
from .typeexpr import ANY, BOOL, ELLIPSIS, FLOAT, INT, NDARRAY, NONE, STR, TENSOR, T, Ty


def binop(left: Ty | None, op: ast.operator, right: Ty | None) -> Ty | None:
    if left is None or right is None:
        return None
    sides = {left, right}
    numbers = {INT, FLOAT, BOOL}
    if TENSOR in sides and sides <= {TENSOR, *numbers}:
        return TENSOR
    if NDARRAY in sides and sides <= {NDARRAY, *numbers}:
        return NDARRAY
    if sides <= numbers:
        if isinstance(op, ast.Div) or FLOAT in sides:
            return FLOAT
        return INT if not isinstance(op, ast.Pow) else None
    if left == STR and (isinstance(op, ast.Mod) or (isinstance(op, ast.Add) and right == STR)):
        return STR
    if left == right and left.name == "list" and isinstance(op, ast.Add):
        return left
    return None


def all_args(fn: FunctionNode) -> list[ast.arg]:
    a = fn.args
    rest = [x for x in (a.vararg, a.kwarg) if x is not None]
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *rest]


def constant(value: object) -> Ty | None:
    if value is None:
        return NONE
    for kind in (bool, int, float, str, bytes, complex):
        if type(value) is kind:
            return T(kind.__name__)
    return None


def numbers(found: list[Ty | None]) -> Ty | None:
    return FLOAT if set(found) == {INT, FLOAT} else None


def item(ty: Ty | None, i: int) -> Ty | None:
    if ty is None or ty.name != "tuple":
        return None
    if len(ty.args) == 2 and ty.args[1].name == ELLIPSIS:
        found = ty.args[0]
    elif -len(ty.args) <= i < len(ty.args):
        found = ty.args[i]
    else:
        return None
    return None if found == ANY else found


def own(fn: FunctionNode, kinds: tuple[type[ast.AST], ...]) -> list[ast.AST]:
    """Nodes of `kinds` in `fn` itself, not in functions, classes or lambdas nested in it."""
    return [node for node in _own(fn) if isinstance(node, kinds)]


@functools.lru_cache(maxsize=512)
def _own(fn: FunctionNode) -> tuple[ast.AST, ...]:
    """Every node of `fn` itself, in `own`'s order: kept, since the inference asks of each
    function several times (its returns, then each parameter no caller types)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, FunctionNode | ast.ClassDef | ast.Lambda):
            continue
        found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return tuple(found)


def terminates(body: list[ast.stmt]) -> bool:
    """The block never runs off its end (it returns or raises on every path we can see)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.Return | ast.Raise):
        return True
    if isinstance(last, ast.If):
        return terminates(last.body) and terminates(last.orelse)
    if isinstance(last, ast.While):
        return (
            isinstance(last.test, ast.Constant)
            and bool(last.test.value)
            and not any(isinstance(n, ast.Break) for n in ast.walk(last))
        )
    if isinstance(last, ast.With | ast.AsyncWith):
        return terminates(last.body)
    if isinstance(last, ast.Try):
        return terminates(last.body) and all(terminates(h.body) for h in last.handlers)
    return False
