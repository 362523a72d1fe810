"""
The `%%train` rewrite (libcst): find the training idioms in a cell, route them through the session.

`rewrite_cell()` never raises on code it does not understand: it returns the new code and a list
of notes, what was instrumented and what was left alone and why. Code that does not parse is the
caller's to report (the magic compiles the cell first so a syntax error reads like IPython's own).
Every transform is inline except the out-of-memory retry point around batch loop bodies (lines
marked `MARK`); `compile_rewritten` maps every position back to the cell's, so a traceback points
at the user's own line.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from .calls import TrainCallTransformer
from .context import SESSION, Note, RewriteContext
from .detect import BACKWARD, CodeFacts, read_facts
from .functions import (
    FunctionSource,
    called_names,
    notebook_function,
    notebook_methods_with_backward,
)
from .loops import BatchLoopTransformer
from .retry import MARK, RetryTransformer, compile_rewritten

__all__ = [
    "MARK",
    "SESSION",
    "CodeFacts",
    "Note",
    "RewriteResult",
    "RewrittenFunction",
    "compile_rewritten",
    "rewrite_cell",
    "rewrite_source",
]

MAX_FUNCTION_DEPTH = 3


@dataclass(frozen=True)
class RewrittenFunction:
    """A notebook function the cell calls, rewritten for the run."""

    original: FunctionSource
    code: str
    facts: CodeFacts


@dataclass
class RewriteResult:
    """The rewritten cell, the notebook functions rewritten with it, and what was done."""

    code: str
    facts: CodeFacts
    functions: dict[str, RewrittenFunction] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
    batch_sources: list[str] = field(default_factory=list)

    @property
    def instrumented(self) -> list[Note]:
        return [n for n in self.notes if n.kind == "instrumented"]

    @property
    def left_alone(self) -> list[Note]:
        return [n for n in self.notes if n.kind == "left alone"]

    def merged_facts(self) -> CodeFacts:
        """Facts of the cell and of every rewritten function together."""
        facts = CodeFacts(**vars(self.facts))
        for fn in self.functions.values():
            facts.backward_calls += fn.facts.backward_calls
            facts.own_autocast |= fn.facts.own_autocast
            facts.own_scaler |= fn.facts.own_scaler
            facts.autograd_grad |= fn.facts.autograd_grad
            offset = fn.original.first_line - 1
            facts.item_lines = (*facts.item_lines, *(n + offset for n in fn.facts.item_lines))
            line = fn.facts.manual_accumulation_line
            if facts.manual_accumulation_line is None and line is not None:
                facts.manual_accumulation_line = line + fn.original.first_line - 1
        return facts


def rewrite_source(
    source: str, context: RewriteContext, trainers: frozenset[str] = frozenset()
) -> tuple[str, CodeFacts]:
    """Rewrite one piece of code (a cell or a function). Raises libcst's ParserSyntaxError."""
    wrapper = cst.MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    facts = read_facts(wrapper, trainers)
    looped = wrapper.visit(BatchLoopTransformer(context, facts))
    called = cst.MetadataWrapper(looped, unsafe_skip_copy=True).visit(TrainCallTransformer(context))
    return called.visit(RetryTransformer()).code, facts


def _reachable_functions(
    module: cst.Module, namespace: Mapping[str, object]
) -> dict[str, tuple[FunctionSource, cst.Module, set[str]]]:
    """Notebook functions the code calls, and those they call, up to MAX_FUNCTION_DEPTH deep."""
    found: dict[str, tuple[FunctionSource, cst.Module, set[str]]] = {}
    frontier, _ = called_names(module)
    for _ in range(MAX_FUNCTION_DEPTH):
        next_frontier: set[str] = set()
        for name in sorted(frontier - found.keys() - {SESSION}):
            fn = notebook_function(name, namespace)
            if fn is None:
                continue
            try:
                fn_module = cst.parse_module(fn.source)
            except cst.ParserSyntaxError:
                continue
            calls, _ = called_names(fn_module)
            found[name] = (fn, fn_module, calls)
            next_frontier |= calls
        frontier = next_frontier
    return found


def _trainers(
    functions: Mapping[str, tuple[FunctionSource, cst.Module, set[str]]],
) -> frozenset[str]:
    """Names of the functions that call backward(), directly or through another such function."""
    trainers = {name for name, (fn, mod, _) in functions.items() if m.findall(mod, BACKWARD)}
    changed = True
    while changed:
        more = {name for name, (_, _, calls) in functions.items() if calls & trainers} - trainers
        trainers |= more
        changed = bool(more)
    return frozenset(trainers)


class _RecordingNamespace(Mapping[str, object]):
    """A read-only view of the namespace that remembers what the rewrite looked up in it."""

    def __init__(self, namespace: Mapping[str, object]) -> None:
        self._namespace = namespace
        self.looked_up: dict[str, object] = {}
        self.types: dict[str, type | None] = {}

    def __getitem__(self, key: str) -> object:
        value = self._namespace[key]
        self.looked_up[key] = value
        return value

    def get(self, key: str, default: object = None) -> object:
        value = self._namespace.get(key, default)
        self.looked_up[key] = value
        return value

    def type_of(self, key: str) -> type | None:
        value = self._namespace.get(key)
        self.types[key] = None if value is None else type(value)
        return self.types[key]

    def still_valid(self, namespace: Mapping[str, object]) -> bool:
        """Whether `namespace` still holds the same functions and the same types of objects."""
        if any(namespace.get(k) is not v for k, v in self.looked_up.items()):
            return False
        return all(
            (None if (v := namespace.get(k)) is None else type(v)) is t
            for k, t in self.types.items()
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._namespace)

    def __len__(self) -> int:
        return len(self._namespace)


# Re-running a cell is the common case (tweak a hyperparameter, run again): its rewrite is reused
# while every name the rewrite looked up still names the same object.
_CACHE: OrderedDict[str, tuple[RewriteResult, _RecordingNamespace]] = OrderedDict()
_CACHE_SIZE = 64


def reset() -> None:
    """Forget every cached rewrite (tests: each starts with an empty cache)."""
    _CACHE.clear()


def rewrite_cell(source: str, namespace: Mapping[str, object] | None = None) -> RewriteResult:
    """Rewrite a `%%train` cell and the notebook functions it calls (looked up in `namespace`)."""
    if namespace is None:
        return _rewrite_cell(source, None)
    cached = _CACHE.get(source)
    if cached is not None and cached[1].still_valid(namespace):
        _CACHE.move_to_end(source)
        return cached[0]
    recorder = _RecordingNamespace(namespace)
    result = _rewrite_cell(source, recorder)
    _CACHE[source] = (result, recorder)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return result


def _rewrite_cell(source: str, namespace: _RecordingNamespace | None) -> RewriteResult:
    context = RewriteContext()
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        context.left_alone(exc.raw_line, "the whole cell", f"libcst cannot parse it: {exc.message}")
        return RewriteResult(source, CodeFacts(), notes=context.notes)
    functions = _reachable_functions(module, namespace) if namespace is not None else {}
    trainers = _trainers(functions)
    code, facts = rewrite_source(source, context, trainers)
    result = RewriteResult(
        code, facts, notes=context.sorted_notes(), batch_sources=context.batch_sources
    )
    if namespace is not None:
        _, methods = called_names(module)
        for qualname in notebook_methods_with_backward(methods, namespace.type_of):
            result.notes.append(
                Note(
                    "left alone",
                    "cell",
                    f"method {qualname}",
                    "methods are not rewritten; optimizer hooks still count its steps",
                )
            )
    for name, (fn, _, _) in functions.items():
        fn_context = RewriteContext(origin=f"function {name}", line_offset=fn.first_line - 1)
        new_source, fn_facts = rewrite_source(fn.source, fn_context, trainers)
        if any(n.kind == "instrumented" for n in fn_context.notes):
            result.functions[name] = RewrittenFunction(fn, new_source, fn_facts)
            result.notes.extend(fn_context.sorted_notes())
            result.batch_sources.extend(fn_context.batch_sources)
    return result
