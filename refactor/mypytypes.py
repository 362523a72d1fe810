"""
Types from mypy's own inference, for what the static engine (`infer`) left untyped.

The engine knows a small table of library calls; mypy, on its first round over the annotated
package, has typed every expression of the functions it checks through the libraries' own stubs
and annotations (torchvision's model builders, a PyG data set's items, NumPy's and pandas'
functions, the package's own annotated returns). Where a parameter still has no annotation and
every call of its function is one mypy typed, the parameter gets the join of the arguments'
types; where a checked function's return has none, the join of what its `return`s give. Only
types the package can name go in: plain classes reached by a public import path (the one the
notebook imported where there is one), the builtins and their generics, tuples, unions, `None`.
The next round checks them like every other annotation: one mypy rejects is removed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .cut import parsed, statements
from .mypynames import Names
from .rejected import functions_of
from .typeexpr import ANY, NONE, T, Ty

_HARMLESS = frozenset({"super", "isinstance", "issubclass", "type"})


@dataclass(frozen=True)
class Suggested:
    """Types for one function (`.module.qualname`): by parameter name, and its return."""

    params: dict[str, Ty] = field(default_factory=dict)
    returns: Ty | None = None


@dataclass
class _Module:
    """One module of the package as mypy parsed it in its latest build: the expressions, the
    functions by key with their `return`s, and the types mypy gave the expressions."""

    expressions: list[Any]
    functions: dict[str, tuple[Any, list[Any]]]
    types: dict[Any, Any] = field(default_factory=dict)


class Collector:
    """What the rounds of one check learn of the package from mypy.

    mypy frees a module's function bodies once it has checked them, so the package's trees are
    read as it parses them (a plugin's `get_additional_deps`, called after parsing), and the
    types of their expressions after the build (`export_types`). A module mypy takes from its
    cache in a later round was not changed, nor anything it depends on: what the round that
    checked it learned still holds."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.modules: dict[str, _Module] = {}
        self.fresh: set[str] = set()
        self.files: dict[str, Any] = {}

    def plugin(self, options: Any) -> Any:
        from mypy.plugin import Plugin

        collector = self

        class _Reader(Plugin):
            def get_additional_deps(self, file: Any) -> list[tuple[int, str, int]]:
                collector.parsed(file)
                return []

        return _Reader(options)

    def parsed(self, tree: Any) -> None:
        from mypy.server.subexpr import get_subexpressions

        name = tree.fullname
        if name != self.package and not name.startswith(self.package + "."):
            return
        module = name[len(self.package) + 1 :]
        self.modules[name] = _Module(get_subexpressions(tree), _functions(tree, module))
        self.fresh.add(name)

    def suggest(
        self,
        files: dict[str, str],
        decorated: Mapping[str, str],
        removed: list[str],
        ours: Mapping[str, object],
    ) -> dict[str, Suggested]:
        """Types for what `files` leaves open (`suggest`), in functions not `decorated`, for
        parameters and returns not `removed` before; `ours` has the signatures we wrote."""
        wanted, preferred, refine = _wanted(files, self.package, decorated, removed, ours)
        return suggest(self, wanted, preferred, refine)

    def built(self, result: Any) -> None:
        types = result.types
        for name in self.fresh:
            module = self.modules[name]
            nodes = [*module.expressions]
            for fn, returns in module.functions.values():
                nodes += [a.initializer for a in fn.arguments if a.initializer is not None]
                nodes += [r.expr for r in returns if r.expr is not None]
            module.types = {n: types[n] for n in nodes if n in types}
        self.fresh.clear()
        self.files = result.files


def _functions(tree: Any, module: str) -> dict[str, tuple[Any, list[Any]]]:
    """The module's functions and methods by key (`.module.qualname`), with their `return`s;
    not the decorated ones (their signature is the decorator's)."""
    from mypy.nodes import ClassDef, FuncDef
    from mypy.traverser import all_return_statements

    found: dict[str, tuple[Any, list[Any]]] = {}
    for node in tree.defs:
        members = [(node, "")] if isinstance(node, FuncDef) else []
        if isinstance(node, ClassDef):
            members = [(s, f"{node.name}.") for s in node.defs.body if isinstance(s, FuncDef)]
        for fn, prefix in members:
            found[f".{module}.{prefix}{fn.name}"] = (fn, all_return_statements(fn))
    return found


def suggest(
    collected: Collector,
    wanted: dict[str, set[str]],
    preferred: Iterable[str] = (),
    refine: Mapping[str, Ty] | None = None,
) -> dict[str, Suggested]:
    """What mypy said of `wanted`: by function key (`.module.qualname`), the parameters (and
    "return") that have no annotation. `refine` has the returns already annotated with a tuple
    some of whose items are `Any` (a section's outputs the static engine did not type): what
    mypy gives those items goes in their place."""
    types: dict[Any, Any] = {}
    for module in collected.modules.values():
        types.update(module.types)
    if not types or not wanted:
        return {}
    package = collected.package
    names = Names(collected.files, package, set(preferred))
    calls = _Calls(types, collected.modules.values(), package)
    functions = {k: v for m in collected.modules.values() for k, v in m.functions.items()}
    found: dict[str, Suggested] = {}
    for key, missing in wanted.items():
        fn, returned = functions.get(key, (None, []))
        if fn is None:
            continue
        # the name it is called by; every call of that name must be one mypy typed
        called = fn.info.name if fn.name == "__init__" and fn.info else fn.name
        open_ = called in calls.untyped or called in calls.values
        params: dict[str, Ty] = {}
        if not open_ and fn.fullname in calls.by_definition:
            for name in missing - {"return"}:
                ty = names.join(calls.arguments(fn, name))
                if ty is not None and ty != NONE:
                    params[name] = ty
        returns = None
        if "return" in missing and returned and not fn.is_generator and not fn.is_coroutine:
            old = (refine or {}).get(key)
            returns = names.join(
                ["None" if r.expr is None else types.get(r.expr) for r in returned],
                loose=old is not None,
            )
            if old is not None:
                returns = _fill(old, returns)
        if params or returns is not None:
            found[key] = Suggested(params, returns)
    return found


def _fill(old: Ty, new: Ty | None) -> Ty | None:
    """`old` (a tuple with `Any` items) with those items typed as in `new`, if any is."""
    if new is None or new.name != "tuple" or len(new.args) != len(old.args):
        return None
    items = [n if o == ANY else o for o, n in zip(old.args, new.args, strict=True)]
    return T("tuple", *items) if items != list(old.args) else None


class _Calls:
    """The calls in the package's modules: those mypy typed, by the package function they
    call; the names called where mypy typed nothing (a function it does not check); and the
    functions and classes used as a value (`collate_fn=collate`), whose calls are out of
    sight."""

    def __init__(self, types: dict[Any, Any], modules: Iterable[_Module], package: str) -> None:
        from mypy.nodes import CallExpr, Decorator, FuncDef, MemberExpr, NameExpr, TypeInfo
        from mypy.types import CallableType, get_proper_type

        self.types = types
        self.by_definition: dict[str, list[tuple[Any, Any]]] = {}
        self.untyped: set[str] = set()
        self.values: set[str] = set()
        prefix = package + "."
        found = [e for m in modules for e in m.expressions]
        quiet: set[int] = set()  # callees, and what `super(Net, self)`, `isinstance` name
        for node in found:
            if isinstance(node, CallExpr):
                quiet.add(id(node.callee))
                if getattr(node.callee, "name", None) in _HARMLESS:
                    quiet.update(id(a) for a in node.args)
        for node in found:
            if isinstance(node, NameExpr) and id(node) not in quiet:
                if isinstance(node.node, FuncDef | Decorator | TypeInfo):
                    self.values.add(node.name)
            elif isinstance(node, MemberExpr) and id(node) not in quiet:
                self.values.add(node.name)
            elif isinstance(node, CallExpr):
                name = getattr(node.callee, "name", None)
                typed = types.get(node.callee)
                if typed is None:
                    if name:
                        self.untyped.add(name)
                    continue
                target = get_proper_type(typed)
                definition = target.definition if isinstance(target, CallableType) else None
                if isinstance(definition, FuncDef) and definition.fullname.startswith(prefix):
                    self.by_definition.setdefault(definition.fullname, []).append((node, target))

    def arguments(self, fn: Any, param: str) -> list[Any]:
        """mypy's types of what every call passes to `param` (None for one it did not type, and
        for a call that passes nothing there: then the default's type, when it has one)."""
        from mypy.argmap import map_actuals_to_formals
        from mypy.nodes import ARG_NAMED, ARG_POS
        from mypy.types import AnyType, TypeOfAny

        unknown = AnyType(TypeOfAny.special_form)  # what `*args` holds matters not: refused
        found: list[Any] = []
        argument = next((a for a in fn.arguments if a.variable.name == param), None)
        if argument is None or argument.kind.is_star():
            return [None]
        for call, callee in self.by_definition.get(fn.fullname, []):
            if param not in callee.arg_names:
                return [None]
            formal = callee.arg_names.index(param)
            mapped = map_actuals_to_formals(
                call.arg_kinds,
                call.arg_names,
                callee.arg_kinds,
                callee.arg_names,
                lambda _: unknown,
            )
            actuals = mapped[formal]
            if not actuals and argument.initializer is not None:
                found.append(self.types.get(argument.initializer))
            elif len(actuals) == 1 and call.arg_kinds[actuals[0]] in (ARG_POS, ARG_NAMED):
                found.append(self.types.get(call.args[actuals[0]]))
            else:
                return [None]
        return found


def _wanted(
    files: dict[str, str],
    package: str,
    decorated: Mapping[str, str],
    removed: list[str],
    ours: Mapping[str, object],
) -> tuple[dict[str, set[str]], set[str], dict[str, Ty]]:
    """What to ask mypy's types for, by function key: the parameters and returns of `files`
    that have no annotation (and the returns of ours, tuples with `Any` items), in functions
    not decorated; the dotted paths the modules import; our tuple returns to fill in."""
    wanted: dict[str, set[str]] = {}
    refine: dict[str, Ty] = {}
    preferred: set[str] = set()
    gone = set(removed)
    for path, code in files.items():
        if not path.startswith(f"{package}/") or not path.endswith(".py"):
            continue
        module = path[len(package) + 1 : -3].replace("/", ".")
        tree = parsed(code)
        if tree is None:
            continue
        preferred |= _imported(tree)
        for qualname, _, _, fn in functions_of(code):
            if f"{module}.{qualname}" in decorated:
                continue
            a = fn.args
            positional = [*a.posonlyargs, *a.args]
            static = any(getattr(d, "id", None) == "staticmethod" for d in fn.decorator_list)
            if "." in qualname and not static:
                positional = positional[1:]  # self, cls
            params = [*positional, *a.kwonlyargs]
            missing = {p.arg for p in params if p.annotation is None}
            key = f".{module}.{qualname}"
            before = getattr(ours.get(key), "returns", None)
            if fn.returns is None:
                missing.add("return")
            elif before is not None and before.name == "tuple" and ANY in before.args:
                missing.add("return")
                refine[key] = before
            missing = {n for n in missing if f"{module}.{qualname}({n})" not in gone}
            if missing:
                wanted[key] = missing
    return wanted, preferred, refine


def _imported(tree: ast.Module) -> set[str]:
    """The dotted paths a module's imports name (`from torch_geometric.data import Data`)."""
    found: set[str] = set()
    for node in statements(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found
