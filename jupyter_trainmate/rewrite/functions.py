"""
Notebook functions the cell calls: real notebooks keep the loop in a `train_epoch()` defined cells
earlier. Such a function is rewritten like the cell (from its source, which IPython keeps in
`linecache`) and swapped in for the cell's duration only. Methods of notebook classes are not
rewritten; optimizer hooks still count their steps, and a note says so.
"""

from __future__ import annotations

import inspect
import textwrap
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

# Decorators that return the function itself (typing's `no_type_check` only sets an attribute):
# a function carrying them is rewritten as if it had none.
NO_OP_DECORATORS = ("@no_type_check\n", "@typing.no_type_check\n")


@dataclass(frozen=True)
class FunctionSource:
    """A notebook function's source, ready to rewrite."""

    name: str
    function: types.FunctionType
    source: str
    first_line: int


def called_names(module: cst.Module) -> tuple[set[str], set[tuple[str, str]]]:
    """Names called as `f(...)` and `obj.method(...)` pairs in `module`."""
    names: set[str] = set()
    methods: set[tuple[str, str]] = set()
    for call in m.findall(module, m.Call()):
        func = call.func if isinstance(call, cst.Call) else None
        if isinstance(func, cst.Name):
            names.add(func.value)
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            methods.add((func.value.value, func.attr.value))
    return names, methods


def notebook_function(name: str, namespace: Mapping[str, object]) -> FunctionSource | None:
    """The function `name` if it was defined in the notebook and can be rewritten from source."""
    fn = namespace.get(name)
    if not isinstance(fn, types.FunctionType):
        return None
    handed = getattr(fn, "__trainmate_rewrite__", False)  # given to jupyter_trainmate.train()
    if not handed and fn.__module__ != "__main__":
        return None
    if fn.__closure__ or not (handed or fn.__code__.co_filename.startswith(("<", "/tmp"))):
        return None
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    source = textwrap.dedent("".join(lines))
    while source.startswith(NO_OP_DECORATORS):  # changes nothing when the function runs
        source = source.split("\n", 1)[1]
        first += 1
    if not source.startswith(("def ", "async def ")):  # decorated: the decorator may wrap it
        return None
    return FunctionSource(name, fn, source, first)


def notebook_methods_with_backward(
    methods: set[tuple[str, str]], type_of: Callable[[str], type | None]
) -> list[str]:
    """`Class.method` names of notebook classes whose method source calls `.backward()`.

    `type_of(name)` gives the type of the object a name holds: the type, not the object, is what
    matters here (a loop rebinds `loss` on every run; its type stays the same).
    """
    found = []
    for obj_name, attr in sorted(methods):
        cls = type_of(obj_name)
        if cls is None or issubclass(cls, types.ModuleType):
            continue
        method = getattr(cls, attr, None)
        if isinstance(method, types.FunctionType) and method.__module__ == "__main__":
            try:
                if ".backward(" in inspect.getsource(method):
                    found.append(f"{cls.__name__}.{attr}")
            except (OSError, TypeError):
                continue
    return found
