"""
A fast read-only walk over a libcst tree, for the questions the steps ask of every statement
(which names it binds, whether it says "cuda", which calls it makes).

libcst's own visitors (`node.visit`, `matchers.findall`, even `node.children`) rebuild every node
they pass through (`_visit_and_replace_children` constructs and validates a copy), which made
those questions cost more than parsing the notebook. Nodes are frozen dataclasses, so their
fields can be read directly: this walk yields the same nodes, in the order of the fields (the
order of the source for the statements and expressions the steps look at), and builds nothing.
Transformers stay libcst's; `needs` lets a step skip a transformer that would change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields

import libcst as cst

_FIELDS: dict[type, tuple[str, ...]] = {}
# what a field's value is, by its type: 1 a node, 2 a list or tuple, 0 anything else (libcst's
# node classes are ABCs: `isinstance` against them goes through `ABCMeta.__instancecheck__`,
# which cost more than the walk itself; a type's answer never changes, so it is kept)
_KIND: dict[type, int] = {}
_IS: dict[tuple[type, type | tuple[type, ...]], bool] = {}


def _names(kind: type) -> tuple[str, ...]:
    names = _FIELDS.get(kind)
    if names is None:
        names = tuple(f.name for f in fields(kind))
        _FIELDS[kind] = names
    return names


def _kind(kind: type) -> int:
    found = _KIND.get(kind)
    if found is None:
        found = 1 if issubclass(kind, cst.CSTNode) else 2 if issubclass(kind, tuple | list) else 0
        _KIND[kind] = found
    return found


def _is(kind: type, wanted: type | tuple[type, ...]) -> bool:
    """`issubclass(kind, wanted)`, kept per pair."""
    found = _IS.get((kind, wanted))
    if found is None:
        found = _IS[(kind, wanted)] = issubclass(kind, wanted)
    return found


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    kinds = _KIND
    for name in _FIELDS.get(type(node)) or _names(type(node)):
        value = getattr(node, name)
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(type(value))
        if kind == 1:
            found.append(value)
        elif kind == 2:
            for element in value:
                element_kind = kinds.get(type(element))
                if element_kind is None:
                    element_kind = _kind(type(element))
                if element_kind == 1:
                    found.append(element)
    return found


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The node's child nodes, in field order."""
    return iter(_children(node))


def walk(
    node: cst.CSTNode, enter: Callable[[cst.CSTNode], bool] | None = None
) -> Iterator[cst.CSTNode]:
    """`node` and every node under it, depth first, parents before their children. `enter`, when
    given, says whether to go below a node (the node itself is yielded either way)."""
    stack = [node]
    pop, extend = stack.pop, stack.extend
    while stack:
        current = pop()
        yield current
        if enter is None or enter(current):
            below = _children(current)
            below.reverse()
            extend(below)


def isa(node: object, kind: type | tuple[type, ...]) -> bool:
    """`isinstance(node, kind)` for libcst's node classes, kept per type: a loop over every node
    of a tree that asks `isinstance(node, cst.Call)` of each went through
    `ABCMeta.__instancecheck__` for every node that is not one (a Python call each). The steps'
    hot loops ask `isa` first and `isinstance` (which narrows the type) only of the nodes it lets
    through."""
    return _is(type(node), kind)


def find(node: cst.CSTNode, kind: type | tuple[type, ...]) -> list[cst.CSTNode]:
    """Every node of `kind` under `node` (itself included), in walk order."""
    return [n for n in walk(node) if _is(type(n), kind)]


def names(node: cst.CSTNode) -> set[str]:
    """Every `Name` under `node` (variables, attributes, keywords, definitions)."""
    return {n.value for n in walk(node) if _is(type(n), cst.Name)}  # type: ignore[attr-defined]
