"""
What a function's own code says about one of its parameters: a value it calls a method only
tensors have on (`x.unsqueeze(0)`, `x.detach()`, `x.view(-1, 784)`: `known.untyped_method`) is a
tensor, when the parameter is never rebound in the function (the call is then on what the caller
passed). Used by `infer` for a parameter its callers do not type.
"""

from __future__ import annotations

import ast

from . import known
from .flow import own
from .symbols import FunctionNode
from .typeexpr import TENSOR


def tensor_only_use(fn: FunctionNode, name: str) -> bool:
    """`fn` calls a tensor-only method on its parameter `name` and never rebinds it."""
    used = False
    for node in own(fn, (ast.Call, ast.Name, ast.arg)):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return False  # rebound (or deleted): a later call may be on another value
        if isinstance(node, ast.arg) and node.arg == name:
            return False  # a lambda's parameter of the same name
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
            and known.untyped_method(node.func.attr, node.args) == TENSOR
        ):
            used = True
    return used
