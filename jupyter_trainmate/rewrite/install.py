"""
Put the rewritten notebook functions and methods in place for one run, and take them out after.

A function is swapped in the namespace under its name; a method is swapped on the class that
defines it (so every instance's `trainer.fit()` finds it), and a name holding it bound
(`fit = trainer.fit`) gets it bound to the same instance. Each is compiled under its own cell's
file name and line numbers, so a traceback through it shows the user's cell and line. `undo()`
puts back every original, also after a partial `install()`, unless the cell itself replaced it.
"""

from __future__ import annotations

import types
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from .context import SESSION
from .retry import compile_rewritten

if TYPE_CHECKING:  # the package imports this module
    from . import RewriteResult, RewrittenFunction


def compile_function(fn: RewrittenFunction) -> types.FunctionType:
    """Compile a rewritten function or method under its own cell's file name and line numbers."""
    source = fn.original
    original = source.function
    filename = original.__code__.co_filename
    code = compile_rewritten(fn.code, source.source, filename, source.first_line)
    scratch: dict[str, Any] = {}
    exec(code, original.__globals__, scratch)
    if source.owner is None:
        new = scratch[source.name]
    else:
        # Compiled in a stand-in class of the same name (for private-name mangling); `super()`
        # must still mean the real class: rebuild the function around a `__class__` cell.
        stand_in = vars(scratch[source.owner.__name__])[source.attr]
        cells = tuple(
            types.CellType(source.owner if name == "__class__" else None)
            for name in stand_in.__code__.co_freevars
        )
        new = types.FunctionType(
            stand_in.__code__, original.__globals__, original.__name__, None, cells or None
        )
        new.__qualname__ = original.__qualname__
        new.__module__ = original.__module__
        new.__doc__ = original.__doc__
    assert isinstance(new, types.FunctionType)
    new.__defaults__, new.__kwdefaults__ = original.__defaults__, original.__kwdefaults__
    return new


class Installed:
    """The rewritten functions and methods of one run, swapped in by `install()`."""

    def __init__(self, result: RewriteResult, namespace: MutableMapping[str, Any]) -> None:
        self.result = result
        self.namespace = namespace
        self._names: list[tuple[str, object, object]] = []  # (name, original, ours)
        self._attrs: list[tuple[type, str, object, object]] = []  # (class, name, original, ours)
        self._globals: list[dict[str, Any]] = []

    def install(self, session: object) -> None:
        for fn in self.result.functions:
            new = compile_function(fn)
            source = fn.original
            if source.owner is None:
                self._swap_name(source.name, new)
            else:
                original = vars(source.owner).get(source.attr)
                self._attrs.append((source.owner, source.attr, original, new))
                setattr(source.owner, source.attr, new)
                for name in fn.bound_names:
                    bound = self.namespace.get(name)
                    if isinstance(bound, types.MethodType) and bound.__func__ is source.function:
                        self._swap_name(name, types.MethodType(new, bound.__self__))
            # A function from a module (jupyter_trainmate.train()) reads the session from its
            # module's globals; a notebook function's globals are the namespace itself.
            if new.__globals__ is not self.namespace and SESSION not in new.__globals__:
                self._globals.append(new.__globals__)
                new.__globals__[SESSION] = session

    def _swap_name(self, name: str, ours: object) -> None:
        self._names.append((name, self.namespace.get(name), ours))
        self.namespace[name] = ours

    def undo(self) -> None:
        """Put every original back, unless the cell itself replaced ours meanwhile."""
        for scope in self._globals:
            scope.pop(SESSION, None)
        for name, original, ours in reversed(self._names):
            if self.namespace.get(name) is ours:
                self.namespace[name] = original
        for cls, attr, original, ours in reversed(self._attrs):
            if vars(cls).get(attr) is ours:
                setattr(cls, attr, original)
        self._names.clear()
        self._attrs.clear()
        self._globals.clear()
