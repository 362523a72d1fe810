"""
Static types through the package's dataflow, without running anything.

Works on the modules as written, so every function an earlier step made (the notebook's own,
section functions, `run()`) is typed the same way:

- constructors: `model = Net(...)` is a `Net`, `DataLoader(...)`, optimizers, schedulers,
  `nn.*` modules, tensors from `torch.*` factories, numpy arrays, pandas frames (`known`);
- call sites: a parameter has the type of every argument passed to it anywhere in the package
  (joined to the nearest common base; a name by the binding that reaches the call where the
  caller's top level makes that certain, `reaching`; `*data`, a tuple of known length, gives
  one argument per item); a function also used as a value (a
  callback such as a `collate_fn`) gets no parameter types from them, since it is called from
  code we cannot see;
- the function's own code, for a parameter the callers leave untyped: its literal default
  (`epochs=3`), a tensor-only method called on it (`x.unsqueeze(0)`, `uses`);
- returns: the join of what every `return` gives (names, literals, constructors, known calls);
- `self.x = ...` in a class types `self.x` in its methods, a dataclass field its annotation.

It repeats until nothing changes (a few rounds: a type found in one function flows to its
callers and callees). The result is immutable: parameter and return types by function key.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from . import known
from .flow import constant
from .scope import Pending, Scope
from .symbols import Function, Package
from .typeexpr import (
    ANY,
    ELLIPSIS,
    INT,
    NONE,
    TENSOR,
    UNION,
    T,
    Ty,
    dotted_name,
    join,
    parse_annotation,
)
from .uses import tensor_only_use

ROUNDS = 6
# the generated `distributed.py`: each returns an object used as the one it is given
SAME_TYPE = frozenset({".distributed.shard", ".distributed.wrap", ".distributed.unwrap"})
# calls that do not call what they are given (`super(Net, self)`, `isinstance(x, Net)`)
HARMLESS = frozenset(
    f"builtins.{n}" for n in ("super", "isinstance", "issubclass", "type", "print", "repr", "str")
)


@dataclass(frozen=True)
class Inferred:
    params: dict[str, dict[str, Ty]]  # function key -> parameter -> type
    returns: dict[str, Ty]  # function key -> return type


_Shape = tuple[list[tuple[ast.Call, str | None]], list[tuple[ast.Name | ast.Attribute, str | None]]]


class Engine:
    def __init__(self, pkg: Package, seeds: dict[str, Ty] | None = None) -> None:
        self.pkg = pkg
        self.seeds = seeds or {}
        self.params: dict[str, dict[str, Ty | None]] = {}
        self.returns: dict[str, Ty | None] = {}
        self.attrs: dict[str, dict[str, Ty | None]] = {}
        self.calls: dict[str, dict[str, list[Ty | None]]] = {}
        self.poisoned: set[str] = set()
        self.uses: dict[str, dict[str, list[Ty]]] = {}  # parameters passed straight to `USES`
        self.module_scopes: dict[str, Scope] = {}
        self.recording = False
        self._shapes: dict[int, _Shape] = {}  # by id of the scope, which lives as long

    def run(self) -> Inferred:
        order = sorted(self.pkg.modules, key=lambda n: n != "config")
        self.module_scopes = {n: Scope(self, self.pkg.modules[n], None) for n in order}
        for scope in self.module_scopes.values():
            scope.solve()
        scopes = {
            fn.key: Scope(self, self.pkg.modules[fn.module], fn)
            for fn in self.pkg.functions.values()
        }
        for _ in range(ROUNDS):
            self.calls, self.poisoned, self.uses = {}, set(), {}
            for scope in scopes.values():
                scope.reset()
                scope.solve()
            returns = {key: self._declared(key) or s.return_type() for key, s in scopes.items()}
            attrs = self._attributes(scopes)
            self.recording = True
            for scope in [*self.module_scopes.values(), *scopes.values()]:
                self._collect(scope)
            self.recording = False
            params = {fn.key: self._param_types(fn) for fn in self.pkg.functions.values()}
            if (params, returns, attrs) == (self.params, self.returns, self.attrs):
                break
            self.params, self.returns, self.attrs = params, returns, attrs
        return Inferred(
            {k: {p: t for p, t in ps.items() if t is not None} for k, ps in self.params.items()},
            {k: t for k, t in self.returns.items() if t is not None},
        )

    # -- what the scopes ask -------------------------------------------------------------------

    def global_type(self, module: str, name: str, depth: int = 0) -> Ty | None:
        scope = self.module_scopes.get(module)
        if scope is None or depth > 8:
            return None
        if name in scope.bindings:
            if name in scope.types:
                return scope.types[name]
            if scope.final:
                return None
            raise Pending(name)
        target = scope.module.bound.get(name, "")
        if target.startswith(".") and not target.startswith(".."):
            where, _, attr = target[1:].rpartition(".")
            return self.global_type(where, attr, depth + 1)
        return None

    def _declared(self, key: str) -> Ty | None:
        """The return type a function was written with (`-> torch.device`), when readable."""
        fn = self.pkg.functions[key]
        return parse_annotation(fn.node.returns, self.pkg.modules[fn.module].resolve)

    def param_type(self, fn: Function, name: str) -> Ty | None:
        node = next((a for a in fn.node.args.args + fn.node.args.posonlyargs), None)
        if fn.cls is not None and node is not None and node.arg == name and name == "self":
            return T(fn.cls)
        for arg in [*fn.node.args.posonlyargs, *fn.node.args.args, *fn.node.args.kwonlyargs]:
            if arg.arg == name and arg.annotation is not None:
                return parse_annotation(arg.annotation, self.pkg.modules[fn.module].resolve)
        return self.params.get(fn.key, {}).get(name)

    def attribute(self, cls: str, attr: str) -> Ty | None:
        for key in self.pkg.ancestors(cls):
            found = self.pkg.classes.get(key)
            if found is None:
                continue
            if attr in found.fields:
                module = self.pkg.modules[key[1:].rpartition(".")[0]]
                return parse_annotation(found.fields[attr], module.resolve)
            if attr in self.attrs.get(key, {}):
                return self.attrs[key][attr]
        return None

    def call_type(self, scope: Scope, call: ast.Call) -> Ty | None:
        """What `call` returns; while recording, also note its arguments for the callee."""
        name = dotted_name(call.func)
        path = scope.resolve(name) if name else None
        if path == "jupyter_trainmate.train" and call.args:
            target = self._function(scope, call.args[0])
            if target is not None:
                self._record(scope, target, call, skip=len(call.args))
                return self.returns.get(target.key)
            return None
        if path in SAME_TYPE and len(call.args) == 1:
            return scope.typeof(call.args[0])  # `model = distributed.wrap(model)` (torchrun)
        if path is not None and path.startswith("."):
            return self._package_call(scope, path, call)
        if path is not None and path.startswith("builtins."):
            return self._builtin(scope, path.removeprefix("builtins."), call)
        if path is not None:
            return known.known_call(path)
        if isinstance(call.func, ast.Attribute):
            receiver = scope.typeof(call.func.value)
            if receiver is None:
                return None if call.keywords else known.untyped_method(call.func.attr, call.args)
            if receiver.name == UNION and all(self.pkg.is_module(m.name) for m in receiver.args):
                # a union of the package's models (`join`): what every nn.Module gives
                if call.func.attr in known.MODULE_SELF:
                    return receiver
                return known.MODULE_METHODS.get(call.func.attr)
            if receiver.name in self.pkg.classes:
                method = self.pkg.method(receiver.name, call.func.attr)
                if method is not None:
                    self._record(scope, method, call)
                    return self.returns.get(method.key)
                held = self.attribute(receiver.name, call.func.attr)  # self.head(x)
                if held is not None:
                    return self._call_value(scope, held, call)
            if self.pkg.is_module(receiver.name):
                if call.func.attr in known.MODULE_SELF:
                    return receiver
                return known.MODULE_METHODS.get(call.func.attr)
            return known.method_type(receiver, call.func.attr, bool(call.args or call.keywords))
        value = scope.typeof(call.func)
        return self._call_value(scope, value, call) if value is not None else None

    def _call_value(self, scope: Scope, value: Ty, call: ast.Call) -> Ty | None:
        """Calling an object: a package module's `forward`, a class's `__call__`, a torch layer."""
        if value.name == UNION and all(self.pkg.is_module(m.name) for m in value.args):
            return join([self._call_value(scope, member, call) for member in value.args])
        if not value.is_class:
            return None
        if value.name in self.pkg.classes:
            forward = self.pkg.is_module(value.name) and self.pkg.method(value.name, "forward")
            method = forward or self.pkg.method(value.name, "__call__")
            if method:
                self._record(scope, method, call)
                found = self.returns.get(method.key)
                return found if found is not None or not forward else TENSOR
            return None
        return known.nn_call(value.name)

    def _package_call(self, scope: Scope, path: str, call: ast.Call) -> Ty | None:
        if path in self.pkg.classes:
            init = self.pkg.method(path, "__init__")
            if init is not None:
                self._record(scope, init, call)
            return T(path)
        fn = self.pkg.functions.get(path)
        if fn is None or fn.cls is not None:
            return None
        self._record(scope, fn, call)
        return self.returns.get(fn.key)

    def _builtin(self, scope: Scope, name: str, call: ast.Call) -> Ty | None:
        args = [scope.typeof(a) for a in call.args]
        if name in known.BUILTIN_SAME:
            return T(name)
        if name in known.BUILTIN_CALLS:
            return known.BUILTIN_CALLS[name]
        if name == "round" and len(args) == 1 and not call.keywords:
            return INT
        if name == "abs" and len(args) == 1:
            return args[0]
        if name in ("list", "sorted", "set") and len(call.args) == 1:
            item = scope.item_type(call.args[0])
            return T("set" if name == "set" else "list", item) if item is not None else None
        if name in ("max", "min") and len(args) >= 2 and not call.keywords:
            return join(args)
        return None

    # -- recording calls -----------------------------------------------------------------------

    def _function(self, scope: Scope, node: ast.expr) -> Function | None:
        name = dotted_name(node)
        path = scope.resolve(name) if name else None
        return self.pkg.functions.get(path) if path else None

    def _record(self, scope: Scope, fn: Function, call: ast.Call, skip: int = 0) -> None:
        if not self.recording:
            return
        seen = self.calls.setdefault(fn.key, {})
        given = _spread(scope, call, call.args[skip:])
        if given is None or any(k.arg is None for k in call.keywords):
            self.poisoned.add(fn.key)
            return
        for arg, ty in zip(fn.positional, given, strict=False):
            seen.setdefault(arg.arg, []).append(ty)
        for keyword in call.keywords:
            seen.setdefault(str(keyword.arg), []).append(scope.at(keyword.value, call))

    def _collect(self, scope: Scope) -> None:
        """Record every call into the package in `scope`; a function that escapes (passed on,
        stored, returned, decorating) is poisoned: it may be called from code we cannot see."""
        calls, escaped = self._shape(scope)
        for node, path in calls:
            scope.typeof(node)
            self._uses(scope, node, path)
        for named, path in escaped:
            if path in self.pkg.classes:
                init = self.pkg.method(path, "__init__")
                path = init.key if init else None
            elif path not in self.pkg.functions and isinstance(named, ast.Attribute):
                receiver = scope.typeof(named.value)  # `self.step` handed on
                if receiver is not None and receiver.name in self.pkg.classes:
                    method = self.pkg.method(receiver.name, named.attr)
                    path = method.key if method else None
            if path in self.pkg.functions:
                self.poisoned.add(path)

    def _shape(self, scope: Scope) -> _Shape:
        """What `_collect` reads of a scope's code and names, which no round's types change:
        its calls (with the path each calls) and the names and attributes that escape (with
        the path each names), in the order of `scope.nodes`; worked out in the first round."""
        known = self._shapes.get(id(scope))
        if known is not None:
            return known
        escapes: set[int] = set()
        calls: list[tuple[ast.Call, str | None]] = []
        for node in scope.nodes:
            if isinstance(node, ast.Call):
                name = dotted_name(node.func)
                path = scope.resolve(name) if name else None
                if path not in HARMLESS:
                    values = node.args[1:] if path == "jupyter_trainmate.train" else node.args
                    escapes |= {id(v) for v in [*values, *(k.value for k in node.keywords)]}
                calls.append((node, path))
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.Return | ast.Yield):
                escapes.add(id(node.value))
            elif isinstance(node, ast.Tuple | ast.List | ast.Set):
                escapes |= {id(e) for e in node.elts}
            elif isinstance(node, ast.Dict):
                escapes |= {id(v) for v in node.values}
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                escapes |= {id(d) for d in node.decorator_list}
        escaped: list[tuple[ast.Name | ast.Attribute, str | None]] = []
        for node in scope.nodes:
            if id(node) in escapes and isinstance(node, ast.Name | ast.Attribute):
                name = dotted_name(node)
                escaped.append((node, scope.resolve(name) if name else None))
        shape = self._shapes[id(scope)] = (calls, escaped)
        return shape

    def _uses(self, scope: Scope, call: ast.Call, path: str | None) -> None:
        """A parameter passed as it is to `nn.Linear(...)`, `range(...)`: it has to be an int."""
        if scope.fn is None or path not in known.USES:
            return
        names, ty = known.USES[path]
        given = list(zip(names, call.args, strict=False))
        given += [(k.arg, k.value) for k in call.keywords if k.arg in names]
        for _, value in given:
            if (
                isinstance(value, ast.Name)
                and value.id in scope.params
                and value.id not in scope.bindings
            ):
                self.uses.setdefault(scope.fn.key, {}).setdefault(value.id, []).append(ty)

    def _attributes(self, scopes: dict[str, Scope]) -> dict[str, dict[str, Ty | None]]:
        found: dict[str, dict[str, list[Ty | None]]] = {}
        for scope in scopes.values():
            if scope.fn is None or scope.fn.cls is None:
                continue
            for attr, values in scope.attr_values.items():
                found.setdefault(scope.fn.cls, {}).setdefault(attr, [])
                found[scope.fn.cls][attr] += [scope.typeof(v) for v in values]
        return {
            cls: {a: join(ts, self.pkg.ancestors) for a, ts in attrs.items()}
            for cls, attrs in found.items()
        }

    def _param_types(self, fn: Function) -> dict[str, Ty | None]:
        types: dict[str, Ty | None] = {}
        seen = self.calls.get(fn.key, {})
        bases = self.pkg.ancestors(fn.cls) if fn.cls else []
        method = fn.qualname.rpartition(".")[2]
        scope = self.module_scopes[fn.module]
        for i, arg in enumerate(fn.params):
            default = fn.default(arg.arg)
            found: list[Ty | None] = [] if fn.key in self.poisoned else list(seen.get(arg.arg, []))
            if fn.key in self.poisoned:
                found.append(None)
            if default is not None:
                found.append(scope.typeof(default))
            ty = join(found, self.pkg.ancestors) if found else None
            used = self.uses.get(fn.key, {}).get(arg.arg)
            if ty is None and used and (default is None or scope.typeof(default) is not None):
                ty = join([*used, *([scope.typeof(default)] if default is not None else [])])
            if ty is None and method == "forward" and "torch.nn.Module" in bases:
                known_other = [t for t in seen.get(arg.arg, []) if t is not None and t != TENSOR]
                ty = TENSOR if default is None and not known_other else None
            if method == "__getitem__" and i == 0 and "torch.utils.data.Dataset" in bases:
                ty = ty or INT
            if ty is None:
                ty = _from_own_code(fn, arg.arg, default, found)
            types[arg.arg] = None if ty == NONE else ty
        return types


def _spread(scope: Scope, call: ast.Call, args: list[ast.expr]) -> list[Ty | None] | None:
    """The types of a call's positional arguments; `*data` where `data` is a tuple of known
    length (`data = get_fold(...)` returning four tensors) gives one per item. None where a
    starred value's length is unknown: the arguments cannot be matched to parameters."""
    found: list[Ty | None] = []
    for value in args:
        if not isinstance(value, ast.Starred):
            found.append(scope.at(value, call))
            continue
        ty = scope.at(value.value, call)
        if ty is None or ty.name != "tuple" or any(t.name == ELLIPSIS for t in ty.args):
            return None
        found += [None if t == ANY else t for t in ty.args]
    return found


def _from_own_code(
    fn: Function, name: str, default: ast.expr | None, given: list[Ty | None]
) -> Ty | None:
    """A parameter the callers do not type (some pass values of unknown type, or it escapes) but
    the function's own code does: a literal default (`seed=42`, `lr=0.1`, `name="x"`) gives its
    type, a value used through a method only tensors have (`x.unsqueeze(0)`) is a tensor. Never
    against a caller whose type is known and differs."""
    known = [t for t in given if t is not None]
    if isinstance(default, ast.Constant):
        ty = constant(default.value)
        if ty is None or ty == NONE or type(default.value) is complex:
            return None
        return join([*known, ty])
    if default is None and tensor_only_use(fn.node, name):
        return TENSOR if all(t == TENSOR for t in known) else None
    return None


def infer(pkg: Package, seeds: dict[str, Ty] | None = None) -> Inferred:
    return Engine(pkg, seeds).run()
