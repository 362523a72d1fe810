"""
Internal (for contributors): the `%%train` rewrite (libcst): find the training idioms in a cell, route them through the session.

`rewrite_cell()` never raises on code it does not understand: it returns the new code and the
notes, what was instrumented and what was left alone and why, as an immutable `RewriteResult`
(cached: a cell run again unchanged gets the same one). The notebook functions and methods the
cell reaches (`functions`) are rewritten with it and put in place for the run by `install`;
`%time`/`%%time` lines are rewritten inside (`magics`). Code that does not parse is the
caller's to report (the magic compiles the cell first so a syntax error reads like IPython's own).
Every transform is inline except the out-of-memory retry point around batch loop bodies (lines
marked `MARK`; only where an out-of-memory error can happen, see `runtime.oom.wants_retry`);
`compile_rewritten` maps every position back to the cell's, so a traceback points at the user's
own line.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import reduce

import libcst as cst
import libcst.matchers as m

from .calls import TrainCallTransformer
from .context import SESSION, Note, RewriteContext
from .detect import BACKWARD, CodeFacts, calls_one_of, read_facts
from .functions import (
    MODULE_CODE,
    FunctionSource,
    Methods,
    bound_notebook_method,
    called_names,
    module_code_that_trains,
    module_notes,
    notebook_function,
    notebook_method,
)
from .loops import (
    BatchLoopTransformer,
    carried_names,
    is_range_like,
    iterated_names,
    over_models,
)
from .magics import MagicTransformer, code_of, magic_calls
from .retry import MARK, RetryTransformer, compile_rewritten, forget_compiled

__all__ = [
    "MARK",
    "SESSION",
    "CodeFacts",
    "FunctionSource",
    "Note",
    "RewriteResult",
    "RewrittenFunction",
    "compile_rewritten",
    "rewrite_cell",
    "rewrite_source",
]

MAX_FUNCTION_DEPTH = 3
GRADIENT_READ = (
    "reads gradients %%train cannot unscale first: a GradScaler would hand it scaled values, so "
    "--amp auto does not pick fp16 and --amp fp16 is refused"
)


@dataclass(frozen=True)
class RewrittenFunction:
    """A notebook function or method the cell reaches, rewritten for the run."""

    original: FunctionSource
    code: str
    facts: CodeFacts  # lines are the cell's the function was defined in
    bound_names: tuple[str, ...] = ()  # names holding the method bound (`fit = trainer.fit`)


@dataclass(frozen=True)
class RewriteResult:
    """The rewritten cell, the notebook functions rewritten with it, and what was done.

    Immutable: the same result is handed out again for a cell run again unchanged.
    """

    code: str
    facts: CodeFacts
    functions: tuple[RewrittenFunction, ...] = ()
    notes: tuple[Note, ...] = ()
    batch_sources: tuple[str, ...] = ()
    carried: tuple[str, ...] = ()  # what the cell's step loop carries between passes (`loops`)

    @property
    def instrumented(self) -> list[Note]:
        return [n for n in self.notes if n.kind == "instrumented"]

    @property
    def left_alone(self) -> list[Note]:
        return [n for n in self.notes if n.kind == "left alone"]

    def merged_facts(self) -> CodeFacts:
        """Facts of the cell and of every rewritten function together."""
        return reduce(CodeFacts.merged, (fn.facts for fn in self.functions), self.facts)


def rewrite_source(
    source: str,
    context: RewriteContext,
    trainers: frozenset[str] = frozenset(),
    model_lists: frozenset[str] = frozenset(),
    retry: bool = True,
    batch_loopers: frozenset[str] = frozenset(),
) -> tuple[str, CodeFacts]:
    """Rewrite one piece of code (a cell or a function). Raises libcst's ParserSyntaxError.

    The facts' lines are `source`'s own (not moved by `context.line_offset`). `model_lists` names
    the lists of models or optimizers the code may loop over (see `loops.over_models`). `retry`:
    whether batch loop bodies get the out-of-memory retry point (`runtime.oom.wants_retry`).
    `batch_loopers`: the trainers that iterate batches themselves (`_Reach.batch_loopers`).
    """
    wrapper = cst.MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    facts = read_facts(wrapper, trainers, batch_loopers)
    for line, code in facts.gradient_reads:
        context.left_alone(line, code, GRADIENT_READ)
    looped = wrapper.visit(BatchLoopTransformer(context, facts, model_lists))
    called = cst.MetadataWrapper(looped, unsafe_skip_copy=True).visit(TrainCallTransformer(context))
    retried = called.visit(RetryTransformer()) if retry else called
    magics = MagicTransformer(
        context,
        lambda code, inner: rewrite_source(
            code, inner, trainers, model_lists, retry, batch_loopers
        ),
    )
    done = cst.MetadataWrapper(retried, unsafe_skip_copy=True).visit(magics)
    shift = -context.line_offset
    return done.code, reduce(CodeFacts.merged, (f.shifted(shift) for f in magics.facts), facts)


def _model_lists(modules: list[cst.Module], namespace: Mapping[str, object]) -> frozenset[str]:
    """Names the code iterates that hold a list or tuple of models or optimizers."""
    torch = sys.modules.get("torch")  # not imported: the namespace holds no models
    if torch is None:
        return frozenset()
    kinds = (torch.nn.Module, torch.optim.Optimizer)
    found = set()
    for name in sorted(set().union(*(iterated_names(module) for module in modules))):
        value = namespace.get(name)
        if isinstance(value, torch.nn.ModuleList) or (
            isinstance(value, list | tuple) and value and all(isinstance(v, kinds) for v in value)
        ):
            found.add(name)
    return frozenset(found)


def _names_in(module: cst.Module) -> tuple[set[str], Methods]:
    """What `module` calls, with what its `%time`/`%%time` lines call."""
    names, methods = called_names(module)
    for found in magic_calls(module):
        inner = code_of(found)
        if inner is not None:
            more_names, more_methods = called_names(inner)
            names |= more_names
            methods |= more_methods
    return names, methods


Key = str | tuple[type, str]


@dataclass
class _Reached:
    source: FunctionSource
    module: cst.Module
    names: set[str]
    methods: Methods
    self_type: type | None  # what `self` is in a method: the instance's class
    bound_names: list[str] = field(default_factory=list)


def _mentions_backward(value: object) -> bool:
    try:
        return ".backward(" in inspect.getsource(value)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False


def _is_step(value: object) -> bool:
    """Whether `value`'s source trains and holds no loop: one call is one training step (the
    `train_step_fn = make_train_step_fn(model, loss_fn, optimizer)` closure of many tutorials)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(value)))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return False
    loops = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.GeneratorExp)
    return not any(isinstance(node, loops) for node in ast.walk(tree))


def _positional(module: cst.Module) -> tuple[list[str], set[str]]:
    """A function's parameters a call can fill by position, and all it can fill by keyword."""
    defs = [s for s in module.body if isinstance(s, cst.FunctionDef)]
    if not defs:
        return [], set()
    params = defs[0].params
    positional = [p.name.value for p in (*params.posonly_params, *params.params)]
    return positional, {
        *positional[len(params.posonly_params) :],
        *(p.name.value for p in params.kwonly_params),
    }


def _handed(call: cst.Call, trainers: set[str], target: _Reached) -> set[str]:
    """The parameters of `target` (a function the call calls) that `call` hands a trainer."""
    positional, by_keyword = _positional(target.module)
    bound: set[str] = set()
    for index, arg in enumerate(call.args):
        if arg.star or not isinstance(arg.value, cst.Name) or arg.value.value not in trainers:
            continue
        if arg.keyword is not None:
            if arg.keyword.value in by_keyword:
                bound.add(arg.keyword.value)
        elif index < len(positional):
            bound.add(positional[index])
    return bound


class _Reach:
    """Notebook functions and methods the code calls, and those they call, a few levels deep."""

    def __init__(self, namespace: _RecordingNamespace, handed: frozenset[object]) -> None:
        self.namespace = namespace
        self.handed = handed
        self.found: dict[Key, _Reached] = {}
        self.notes: list[Note] = []
        self._noted: set[str] = set()
        # names holding a function that trains in one call and cannot be rewritten (a closure):
        # a loop calling it, or a notebook function it is handed to, trains
        self.opaque_steps: set[str] = set()

    def run(self, names: set[str], methods: Methods, made: Mapping[str, str] = {}) -> None:
        """`made`: the names the code binds to a call of a class (`trainer = Trainer()`): their
        methods are that class's, though the namespace does not hold them yet."""
        frontier: list[tuple[set[str], Methods, type | None, type | None, str, Mapping[str, str]]]
        frontier = [(names, methods, None, None, "cell", made)]
        for _ in range(MAX_FUNCTION_DEPTH):
            before = set(self.found)
            for calls, pairs, self_type, owner, origin, bound in frontier:
                self.notes += module_notes(calls, pairs, self.namespace.peek, origin)
                for name in sorted(calls - {SESSION}):
                    self._function(name)
                for obj, attr in sorted(pairs):
                    if obj == "super()":
                        self._super_method(self_type, owner, attr)
                        continue
                    cls = self_type if obj == "self" else self._class_of(obj, bound)
                    if cls is not None and not issubclass(cls, types.ModuleType):
                        self._method(cls, attr, cls)
            frontier = [
                (
                    r.names,
                    r.methods,
                    r.self_type,
                    r.source.owner,
                    f"{r.source.kind} {r.source.name}",
                    made_by_constructors(r.module),
                )
                for key, r in self.found.items()
                if key not in before
            ]

    def _class_of(self, name: str, made: Mapping[str, str]) -> type | None:
        """The class of what `name` holds: the class the code calls to make it, else the type
        of the namespace's value."""
        if name in made:
            cls = self.namespace.get(made[name])
            if isinstance(cls, type):
                return cls
        return self.namespace.type_of(name)

    def _skipped(self, what: str, value: object, why: str, name: str | None = None) -> None:
        if what not in self._noted and _mentions_backward(value):
            self._noted.add(what)
            self.notes.append(Note("left alone", what, "its training calls", why))
            if name is not None and _is_step(value):
                self.opaque_steps.add(name)

    def _function(self, name: str) -> None:
        if name in self.found:
            return
        if not isinstance(self.namespace.peek(name), types.FunctionType | types.MethodType):
            # Only the type matters (the loop variables a cell passes around change every run).
            self.namespace.type_of(name)
            return
        value = self.namespace.get(name)
        fn = notebook_function(name, self.namespace, self.handed)
        if fn is None and isinstance(value, types.MethodType):
            method = bound_notebook_method(value)
            if isinstance(method, FunctionSource):
                assert method.owner is not None
                reached = self._add((method.owner, method.attr), method, type(value.__self__))
                if reached is not None and name not in reached.bound_names:
                    reached.bound_names.append(name)
                return
            fn = method
        if isinstance(fn, str):
            self._skipped(f"function {name}", value, f"not rewritten: {fn}", name)
        elif fn is not None:
            self._add(name, fn, None)

    def _super_method(self, self_type: type | None, owner: type | None, attr: str) -> None:
        """`super().attr()` in a method of `owner`: the next class along the instance's MRO."""
        if self_type is None or owner is None or owner not in self_type.__mro__:
            return
        after = self_type.__mro__[self_type.__mro__.index(owner) + 1 :]
        for cls in after:
            if attr in vars(cls):
                self._method(cls, attr, self_type)
                return

    def _method(self, cls: type, attr: str, self_type: type) -> None:
        method = notebook_method(cls, attr)
        if isinstance(method, str):
            self._skipped(
                f"method {cls.__name__}.{attr}", getattr(cls, attr), f"not rewritten: {method}"
            )
        elif method is not None:
            assert method.owner is not None
            self.namespace.methods.append((method.owner, attr, method.function))
            self._add((method.owner, attr), method, self_type)
        else:
            filename = module_code_that_trains(getattr(cls, attr, None))
            what = f"method {cls.__name__}.{attr}"
            if filename is not None and what not in self._noted:
                self._noted.add(what)
                self.notes.append(Note("left alone", what, f"from {filename}", MODULE_CODE))

    def _add(self, key: Key, fn: FunctionSource, self_type: type | None) -> _Reached | None:
        if key in self.found:
            return self.found[key]
        try:
            module = cst.parse_module(fn.source)
        except cst.ParserSyntaxError:
            return None
        names, methods = _names_in(module)
        self.found[key] = _Reached(fn, module, names, methods, self_type)
        return self.found[key]

    def trainers(self, cell: cst.Module) -> tuple[frozenset[str], dict[Key, frozenset[str]]]:
        """Names of what trains, and per reached function the parameters that hold a trainer.

        Functions by their names (and the names holding a bound method), methods as `.name`: a
        function trains when it calls backward(), calls or hands on such a function, or calls a
        parameter that a call site hands one (`mini_batch(device, loader, train_step_fn)` makes
        `step_fn` a trainer inside `mini_batch`, and so `mini_batch` one).
        """

        reached = list(self.found.items())
        functions = {r.source.name: r for _, r in reached if r.source.owner is None}
        trainers: set[str] = set(self.opaque_steps)
        for _, r in reached:
            if m.findall(r.module, BACKWARD):
                trainers |= names_of(r)
        handed: dict[Key, set[str]] = {}
        sites: list[tuple[Key | None, cst.Call]] = [
            (owner, call)
            for owner, module in [(None, cell), *((key, r.module) for key, r in reached)]
            for call in m.findall(module, m.Call(func=m.Name()))
            if isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value in functions
        ]
        changed = True
        while changed:
            changed = False
            for key, r in reached:
                if not names_of(r) <= trainers and calls_of(r) & (
                    trainers | handed.get(key, set())
                ):
                    trainers |= names_of(r)
                    changed = True
            for owner, call in sites:
                assert isinstance(call.func, cst.Name)
                target = functions[call.func.value]
                local = trainers | (handed.get(owner, set()) if owner is not None else set())
                key = next(k for k, r in reached if r is target)
                more = _handed(call, local, target) - handed.get(key, set())
                if more:
                    handed.setdefault(key, set()).update(more)
                    changed = True
        return frozenset(trainers), {key: frozenset(names) for key, names in handed.items()}

    def batch_loopers(
        self, trainers: frozenset[str], model_lists: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """Names (as `trainers` spells them) of the reached functions that iterate batches
        themselves: a training loop over something other than a counter in their code, or a call
        of such a function (`fit(model)` holding `for epoch ...: for x, y in loader:`). A loop
        that trains only through them is not a batch loop (`for w in widths: fit(make(w))`)."""
        reached = list(self.found.values())
        found: set[str] = set()
        for r in reached:
            if _loops_over_batches(r.module, trainers, model_lists):
                found |= names_of(r)
        changed = True
        while changed:
            changed = False
            for r in reached:
                if not names_of(r) <= found and calls_of(r) & found:
                    found |= names_of(r)
                    changed = True
        return frozenset(found)


def names_of(r: _Reached) -> set[str]:
    """The names a call of a reached function goes by: `f`, or `.method` and its bound names."""
    if r.source.owner is None:
        return {r.source.name}
    return {f".{r.source.attr}", *r.bound_names}


def calls_of(r: _Reached) -> set[str]:
    return r.names | {f".{attr}" for _, attr in r.methods}


def made_by_constructors(module: cst.CSTNode) -> dict[str, str]:
    """Names bound to a call of a name (`trainer = Trainer(model)`): name -> what is called.
    Whether that is a class is the namespace's to say."""
    made: dict[str, str] = {}
    for node in m.findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        assert isinstance(node, cst.Assign)
        target, value = node.targets[0].target, node.value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
            assert isinstance(target, cst.Name)
            made[target.value] = value.func.value
    return made


def cell_functions(
    module: cst.Module,
    trainers: frozenset[str],
    loopers: frozenset[str],
    model_lists: frozenset[str],
) -> tuple[frozenset[str], frozenset[str]]:
    """`trainers` and `loopers` (`_Reach.trainers`, `_Reach.batch_loopers`) with the cell's own
    functions added: those defined in the cell (outside its classes) that train, and those of
    them that iterate batches. A loop calling one trains through it (`for epoch in range(n):
    train(epoch)`, `train` defined above it in the same cell), as through a notebook function."""
    defs: dict[str, cst.FunctionDef] = {}

    class Defs(cst.CSTVisitor):
        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False  # methods are reached through their objects, not by name

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            defs[node.name.value] = node

    module.visit(Defs())
    if not defs:
        return trainers, loopers
    calls = {name: list(m.findall(node.body, m.Call())) for name, node in defs.items()}
    found, looping = set(trainers), set(loopers)
    changed = True
    while changed:
        changed = False
        for name, node in defs.items():
            if name not in found and (
                m.findall(node.body, BACKWARD)
                or any(isinstance(c, cst.Call) and calls_one_of(c, found) for c in calls[name])
            ):
                found.add(name)
                changed = True
            if (
                name in found
                and name not in looping
                and (
                    _loops_over_batches(node.body, frozenset(found), model_lists)
                    or any(
                        isinstance(c, cst.Call) and calls_one_of(c, looping) for c in calls[name]
                    )
                )
            ):
                looping.add(name)
                changed = True
    return frozenset(found), frozenset(looping)


def _loops_over_batches(
    module: cst.CSTNode, trainers: frozenset[str], model_lists: frozenset[str]
) -> bool:
    """Whether `module` holds a `for` loop over something other than a counter (or the
    notebook's models: `for net, opt in zip(nets, opts)`) whose body calls backward() or a
    function that trains."""
    for loop in m.findall(module, m.For()):
        assert isinstance(loop, cst.For)
        if is_range_like(loop.iter) or over_models(loop.iter, model_lists):
            continue
        if m.findall(loop.body, BACKWARD):
            return True
        if any(
            isinstance(call, cst.Call) and calls_one_of(call, trainers)
            for call in m.findall(loop.body, m.Call())
        ):
            return True
    return False


class _RecordingNamespace(Mapping[str, object]):
    """A read-only view of the namespace that remembers what the rewrite looked up in it."""

    def __init__(self, namespace: Mapping[str, object]) -> None:
        self._namespace = namespace
        self.looked_up: dict[str, object] = {}
        self.types: dict[str, type | None] = {}
        self.methods: list[tuple[type, str, object]] = []  # (class, name, the function found)

    def __getitem__(self, key: str) -> object:
        value = self._namespace[key]
        self.looked_up[key] = value
        return value

    def get(self, key: str, default: object = None) -> object:
        value = self._namespace.get(key, default)
        self.looked_up[key] = value
        return value

    def peek(self, key: str) -> object:
        """The value, not remembered: for what only its type (`type_of`) decides."""
        return self._namespace.get(key)

    def type_of(self, key: str) -> type | None:
        value = self._namespace.get(key)
        self.types[key] = None if value is None else type(value)
        return self.types[key]

    def still_valid(self, namespace: Mapping[str, object]) -> bool:
        """Whether `namespace` still holds the same functions and the same types of objects."""
        if any(namespace.get(k) is not v for k, v in self.looked_up.items()):
            return False
        if any(vars(cls).get(attr) is not fn for cls, attr, fn in self.methods):
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
# while every name the rewrite looked up still names the same object. Keyed by whether it has
# retry points too, so a run asking for them never gets a rewrite without.
_CACHE: OrderedDict[
    tuple[str, frozenset[object], bool], tuple[RewriteResult, _RecordingNamespace]
] = OrderedDict()
_CACHE_SIZE = 64


def reset() -> None:
    """Forget every cached rewrite and compiled cell (tests: each starts with empty caches)."""
    _CACHE.clear()
    forget_compiled()


def rewrite_cell(
    source: str,
    namespace: Mapping[str, object] | None = None,
    handed: frozenset[object] = frozenset(),
    retry: bool = True,
) -> RewriteResult:
    """Rewrite a `%%train` cell and the notebook functions and methods it reaches.

    They are looked up in `namespace`; functions in `handed` (given to `train()`) are rewritten
    wherever they were defined. `retry`: whether batch loop bodies get the out-of-memory retry
    point (a run decides with `runtime.oom.wants_retry(options.oom_retry)`).
    """
    if namespace is None:
        return _rewrite_cell(source, None, handed, retry)
    key = (source, handed, retry)
    cached = _CACHE.get(key)
    if cached is not None and cached[1].still_valid(namespace):
        _CACHE.move_to_end(key)
        return cached[0]
    recorder = _RecordingNamespace(namespace)
    result = _rewrite_cell(source, recorder, handed, retry)
    _CACHE[key] = (result, recorder)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return result


def _rewrite_cell(
    source: str, namespace: _RecordingNamespace | None, handed: frozenset[object], retry: bool
) -> RewriteResult:
    context = RewriteContext()
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        context.left_alone(exc.raw_line, "the whole cell", f"libcst cannot parse it: {exc.message}")
        return RewriteResult(source, CodeFacts(), notes=tuple(context.notes))
    reach = _Reach(namespace, handed) if namespace is not None else None
    if reach is not None:
        reach.run(*_names_in(module), made_by_constructors(module))
    trainers, holding = reach.trainers(module) if reach is not None else (frozenset(), {})
    model_lists = (
        _model_lists([module, *(r.module for r in reach.found.values())], namespace)
        if reach is not None and namespace is not None
        else frozenset()
    )
    loopers = reach.batch_loopers(trainers, model_lists) if reach is not None else frozenset()
    trainers, loopers = cell_functions(module, trainers, loopers, model_lists)
    code, facts = rewrite_source(source, context, trainers, model_lists, retry, loopers)
    notes = [*context.sorted_notes(), *(reach.notes if reach is not None else ())]
    batch_sources = list(context.batch_sources)
    functions = []
    for key, r in reach.found.items() if reach is not None else ():
        fn = r.source
        fn_context = RewriteContext(f"{fn.kind} {fn.name}", line_offset=fn.first_line - 1)
        try:
            new_source, fn_facts = rewrite_source(
                fn.source,
                fn_context,
                trainers | holding.get(key, frozenset()),
                model_lists,
                retry,
                loopers,
            )
        except cst.ParserSyntaxError:
            continue
        if any(n.kind == "instrumented" for n in fn_context.notes):
            shifted = fn_facts.shifted(fn.first_line - 1)
            functions.append(RewrittenFunction(fn, new_source, shifted, tuple(r.bound_names)))
            notes.extend(fn_context.sorted_notes())
            batch_sources.extend(fn_context.batch_sources)
    return RewriteResult(
        code, facts, tuple(functions), tuple(notes), tuple(batch_sources), carried_names(source)
    )
