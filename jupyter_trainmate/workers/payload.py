"""
A cell and the notebook state it reads, as bytes another process can run it from.

`build(source, namespace, what)` finds the names the cell reads (Python's own symbol table of
the cell: every name it loads at cell level or as a global from a function, lambda or
comprehension inside it) and pickles their values with cloudpickle in one dump, so that objects
shared between them stay shared on the other side (the optimizer's parameters are the model's).
Functions and classes the notebook defined travel by value (cloudpickle's rule for `__main__`),
with the globals they read; `load()` makes those globals and the loaded values one dict, the
namespace to run the cell in, so a notebook function sees what the cell sees.
Tensors on a GPU are copied to the CPU while pickling (the notebook's own stay where they are),
and loaded onto the loading process's current GPU (a worker's own) where there is one.
The lines of the notebook's cells go along (the rewrite reads functions' sources from them).

What cannot be sent is refused before any process starts, with one line naming the variable:
`cannot send 'f' to the workers: an open file (TextIOWrapper)`. The whole dump is tried first;
only when it fails is each value pickled alone to find the one to name.

Reuse: anything that runs a cell elsewhere (the workers of `%%train --procs`, a sweep running
configurations in parallel processes) builds one `Payload` and loads it in each process.
"""

from __future__ import annotations

import io
import linecache
import marshal
import pickle
import re
import symtable
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ..errors import TrainmateError

# Names a namespace always has and never sends: the interpreter's and the session's.
_NOT_SENT = frozenset({"__builtins__", "__trainmate__", "get_ipython", "exit", "quit"})

_KNOWN_UNSENDABLE = {
    "TextIOWrapper": "an open file",
    "BufferedReader": "an open file",
    "BufferedWriter": "an open file",
    "BufferedRandom": "an open file",
    "FileIO": "an open file",
    "socket": "a network socket",
    "generator": "a generator (it runs where it was made)",
    "_thread.lock": "a lock",
    "_thread.RLock": "a lock",
    "Thread": "a thread",
    "SSLContext": "an SSL context",
    "Connection": "a connection",
    "frame": "a running frame",
}


def cell_reads(source: str) -> list[str]:
    """The global names `source` reads, in the order first seen (the cell level and every
    function, lambda and comprehension inside it)."""
    seen: dict[str, None] = {}

    def walk(table: symtable.SymbolTable, top: bool) -> None:
        for symbol in table.get_symbols():
            if not symbol.is_referenced():
                continue
            if top or symbol.is_global() or symbol.is_declared_global():
                seen.setdefault(symbol.get_name(), None)
        for child in table.get_children():
            walk(child, False)

    walk(symtable.symtable(source, "<cell>", "exec"), True)
    return list(seen)


def reached(names: Iterable[str], namespace: Mapping[str, object]) -> set[str]:
    """`names` and the globals the notebook's functions and classes among them read, and so on:
    everything of the namespace that travels with them."""
    found: set[str] = set()
    todo = [n for n in names if n in namespace]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        value = namespace[name]
        functions = [value]
        if isinstance(value, type) and value.__module__ == "__main__":
            functions = list(vars(value).values())
        for fn in functions:
            if isinstance(fn, types.FunctionType) and fn.__module__ == "__main__":
                todo += [n for n in _code_names(fn.__code__) if n in namespace]
    return found


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _sendable_name(name: str) -> bool:
    return name not in _NOT_SENT and not (name.startswith("_") and name[1:].isdigit())


@dataclass(frozen=True)
class Payload:
    """What another process needs to run a cell: its source, the values it reads (one
    cloudpickle dump) and the notebook's cell sources (for `linecache`)."""

    source: str
    filename: str
    names: tuple[str, ...]
    values: bytes
    cells: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # what the caller adds (options...)

    def dumps(self) -> bytes:
        data: bytes = cloudpickle.dumps(self)
        return data


class _ToCpu(cloudpickle.CloudPickler):  # type: ignore[misc]
    """cloudpickle, with tensors on another device (and results of the autograd graph) pickled
    as CPU copies."""

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if isinstance(obj, types.CodeType):
            # cloudpickle writes "<dynamic-code>" as every function's file name; the cell's own
            # keeps the function's source findable (the rewrite) and its tracebacks readable.
            # The workers run the same Python, so marshal's format is theirs.
            return marshal.loads, (marshal.dumps(obj),)
        if (
            isinstance(obj, torch.Tensor)
            and not isinstance(obj, torch.nn.Parameter)
            and (obj.device.type != "cpu" or (obj.requires_grad and not obj.is_leaf))
        ):  # a GPU tensor, or a result of the graph (a loss): its values on the CPU
            copy = obj.detach().to("cpu")
            if obj.requires_grad and obj.is_leaf:
                copy.requires_grad_(True)
            return _placed, (copy, obj.device.type)
        return super().reducer_override(obj)


def _placed(tensor: Any, device_type: str) -> Any:
    """A tensor that was on a GPU goes to the loading process's current GPU (a worker's own,
    `torch.cuda.set_device`), where there is one; else it stays on the CPU."""
    if device_type == "cuda":
        import torch

        if torch.cuda.is_available():
            return tensor.to(torch.device("cuda", torch.cuda.current_device()))
    return tensor


def dumps(value: Any) -> bytes:
    """cloudpickle `value`, tensors on a GPU as CPU copies."""
    buffer = io.BytesIO()
    _ToCpu(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def why_unsendable(exc: BaseException) -> str:
    """A short reason for a pickling error: what kind of object could not travel."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("Cannot pickle files that are not opened for reading"):
        return "a file open for writing (TextIOWrapper)"  # cloudpickle sends files read-only
    match = re.search(r"(?:cannot pickle|Can't pickle) '?<?([\w.]+)", text)
    if match:
        kind = match.group(1).removeprefix("_io.").removeprefix("class ")
        for key, words in _KNOWN_UNSENDABLE.items():
            if kind == key or kind.endswith("." + key):
                return f"{words} ({kind.rsplit('.', 1)[-1]})"
        return f"a {kind} object cannot be pickled"
    return text[:160]


def _order_for_blame(names: Iterable[str], namespace: Mapping[str, object]) -> list[str]:
    """Plain values first, functions and classes last: a function that reads a variable fails
    for that variable's sake, and the variable is the one to name."""
    names = list(names)
    code = [n for n in names if isinstance(namespace[n], types.FunctionType | type)]
    return [n for n in names if n not in code] + code


def _global_to_blame(value: object) -> tuple[str, BaseException] | None:
    """The global a notebook function reads that cannot be pickled, and the error."""
    if not isinstance(value, types.FunctionType):
        return None
    for name in value.__code__.co_names:
        if name in value.__globals__ and _sendable_name(name):
            try:
                dumps(value.__globals__[name])
            except Exception as exc:
                return name, exc
    return None


def build(
    source: str,
    filename: str,
    namespace: Mapping[str, object],
    what: str,
    *,
    extra: dict[str, Any] | None = None,
) -> Payload:
    """The payload of `source` run in `namespace`; `what` starts a refusal (`%%train --procs`).

    Raises `TrainmateError` with one line naming the variable that cannot be sent and why.
    """
    names = [n for n in cell_reads(source) if n in namespace and _sendable_name(n)]
    values = {n: namespace[n] for n in names}
    try:
        data = dumps(values)
    except Exception as whole:
        for name in _order_for_blame(names, namespace):
            try:
                dumps(values[name])
            except Exception as exc:
                culprit = _global_to_blame(values[name]) or (name, exc)
                reads = f" ({name} reads it)" if culprit[0] != name else ""
                raise TrainmateError(
                    f"{what}: cannot send {culprit[0]!r} to the workers: "
                    f"{why_unsendable(culprit[1])}{reads}"
                ) from None
        raise TrainmateError(
            f"{what}: cannot send the cell's variables to the workers: {why_unsendable(whole)}"
        ) from None
    return Payload(source, filename, tuple(names), data, _cell_sources(), dict(extra or {}))


def _cell_sources() -> dict[str, str]:
    """The notebook's cells as `linecache` holds them (registered with no modification time)."""
    found = {}
    for name, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[1] is None and entry[2]:
            found[name] = "".join(entry[2])
    return found


def load(payload: Payload) -> dict[str, Any]:
    """The namespace to run the payload's cell in: its values, which are also the globals of
    the notebook functions and classes that came with them."""
    for name, text in payload.cells.items():
        lines = text.splitlines(keepends=True)
        linecache.cache[name] = (len(text), None, lines, name)
    values: dict[str, Any] = cloudpickle.loads(payload.values)
    namespace: dict[str, Any] | None = None
    for value in values.values():
        shared = _notebook_globals(value)
        if shared is not None:
            namespace = shared
            break
    if namespace is None:
        namespace = {}
    namespace.update(values)
    namespace.setdefault("__name__", "__main__")
    namespace.setdefault("__builtins__", __builtins__)
    return namespace


def _notebook_globals(value: object) -> dict[str, Any] | None:
    """The globals of a notebook function that came by value (a class: one of its methods')."""
    functions: list[object] = [value]
    if isinstance(value, type) and value.__module__ == "__main__":
        functions = list(vars(value).values())
    for fn in functions:
        if isinstance(fn, types.FunctionType) and fn.__module__ == "__main__":
            return fn.__globals__
    return None
