"""
The names of one function (or one module) and the static type of each: flow-insensitive, a name
has a type when every binding of it gives that same type. `typeof` gives an expression's type
from literals, constructors, known library calls (`known`) and the package's own functions (their
current return types, from `infer`), and, in the last walk, records every call into the package.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from . import known
from .flow import all_args, binop, constant, item, numbers, own, terminates
from .reaching import Reaching, Updated
from .symbols import Function, FunctionNode, Module
from .typeexpr import (
    ANY,
    BOOL,
    ELLIPSIS,
    INT,
    NDARRAY,
    NONE,
    STR,
    TENSOR,
    T,
    Ty,
    dotted_name,
    element,
    join,
    parse_annotation,
)

if TYPE_CHECKING:
    from .infer import Engine

COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
Source = tuple[
    str, ast.AST, tuple[int, ...]
]  # ("value" | "iter" | "ann" | "aug" | "unknown", node, path)


class Pending(Exception):
    """A name whose bindings are not solved yet (the solver tries again)."""


class Scope:
    def __init__(self, engine: Engine, module: Module, fn: Function | None) -> None:
        self.e = engine
        self.module = module
        self.fn = fn
        self.bindings: dict[str, list[Source]] = {}
        self.attr_values: dict[str, list[ast.expr]] = {}  # self.<attr> = value
        self.appended: dict[str, list[ast.expr]] = {}  # name.append(value): items of `name = []`
        self.globals: set[str] = set()
        self.hidden: set[str] = set()  # local imports, nested functions and classes
        self.types: dict[str, Ty | None] = {}
        self.final = False
        self.memo: dict[int, Ty | None] = {}  # expression -> type, once solved (while recording)
        self._nodes: list[ast.AST] | None = None
        self._returns: list[ast.AST] | None = None
        self.extra: dict[str, Ty | None] = {}  # comprehension variables while one is typed
        self._reaching: Reaching | None = None
        self.at_memo: dict[tuple[int, int], Ty | None] = {}  # (name, where) -> type, recording
        self.params = {a.arg for a in all_args(fn.node)} if fn else set()
        self.body: list[ast.stmt] = fn.node.body if fn else module.tree.body
        for statement in self.body:
            self._walk(statement)
        for name in self.params & set(self.bindings):  # a parameter rebound: one more binding
            self.bindings[name].insert(0, ("param", ast.Pass(), ()))

    # -- bindings ------------------------------------------------------------------------------

    def _walk(self, node: ast.AST) -> None:
        if isinstance(node, FunctionNode | ast.ClassDef):
            if self.fn is not None:
                self.hidden.add(node.name)
            return
        if isinstance(node, (ast.Lambda, *COMPREHENSIONS)):
            return
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind(target, ("value", node.value, ()))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            self._bind(node.target, ("ann", node.annotation, ()))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            self._bind(node.target, ("aug", node, ()))
        elif isinstance(node, ast.For | ast.AsyncFor):
            self._bind(node.target, ("iter", node.iter, ()))
        elif isinstance(node, ast.NamedExpr):
            self._bind(node.target, ("value", node.value, ()))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bind(node.optional_vars, ("unknown", node, ()))
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self.bindings.setdefault(node.name, []).append(("unknown", node, ()))
        elif isinstance(node, ast.Import | ast.ImportFrom) and self.fn is not None:
            self.hidden |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.attr == "append"
            and len(node.args) == 1
        ):
            self.appended.setdefault(node.func.value.id, []).append(node.args[0])
        elif isinstance(node, ast.Global | ast.Nonlocal):
            self.globals |= set(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            self.bindings.setdefault(node.name, []).append(("unknown", node, ()))
        for child in ast.iter_child_nodes(node):
            self._walk(child)

    def _bind(self, target: ast.AST, source: Source) -> None:
        kind, node, path = source
        if isinstance(target, ast.Name):
            self.bindings.setdefault(target.id, []).append(source)
        elif isinstance(target, ast.Tuple | ast.List):
            starred = any(isinstance(e, ast.Starred) for e in target.elts)
            for i, elt in enumerate(target.elts):
                self._bind(elt, ("unknown", node, ()) if starred else (kind, node, (*path, i)))
        elif isinstance(target, ast.Starred):
            self._bind(target.value, ("unknown", node, ()))
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and kind == "value"
            and not path
            and isinstance(node, ast.expr)
        ):
            self.attr_values.setdefault(target.attr, []).append(node)

    def _source_type(self, name: str, source: Source) -> Ty | None:
        kind, node, path = source
        ty: Ty | None = None
        if kind == "value" and isinstance(node, ast.List) and not node.elts and not path:
            items = [self.typeof(v) for v in self.appended.get(name, [])]  # `xs = []; xs.append(1)`
            inner = join(items, self.e.pkg.ancestors) if items else None
            ty = T("list", inner) if inner is not None and inner != NONE else None
        elif kind == "value" and isinstance(node, ast.expr):
            ty = self.typeof(node)
        elif kind == "iter" and isinstance(node, ast.expr):
            ty = self.item_type(node)
        elif kind == "ann" and isinstance(node, ast.expr):
            ty = parse_annotation(node, self.resolve)
        elif kind == "param" and self.fn is not None:
            ty = self.e.param_type(self.fn, name)
        elif kind == "aug" and isinstance(node, ast.AugAssign):
            ty = binop(self.lookup(name), node.op, self.typeof(node.value))
        for i in path:
            ty = item(ty, i)
        return ty

    def reset(self) -> None:
        """Forget the types of the last round (the parameters' may have changed)."""
        self.types, self.final, self.memo, self.at_memo = {}, False, {}, {}

    @property
    def nodes(self) -> list[ast.AST]:
        """Every node of the body, not inside nested functions or classes (lambdas included)."""
        if self._nodes is None:
            found: list[ast.AST] = []
            todo: list[ast.AST] = list(self.body)
            while todo:
                node = todo.pop()
                if isinstance(node, FunctionNode | ast.ClassDef):
                    todo += node.decorator_list
                    continue
                found.append(node)
                todo.extend(ast.iter_child_nodes(node))
            self._nodes = found
        return self._nodes

    def solve(self) -> None:
        for _ in range(6):
            changed = False
            for name, sources in self.bindings.items():
                declared = [s for s in sources if s[0] == "ann"]
                found: list[Ty | None] = []
                for source in declared or sources:
                    try:
                        found.append(self._source_type(name, source))
                    except Pending:
                        continue
                if not found:
                    continue
                new = found[0] if all(f == found[0] for f in found) else None
                if new is None and all(f is not None for f in found):
                    new = numbers(found)
                if name not in self.types or self.types[name] != new:
                    self.types[name] = new
                    changed = True
            if not changed:
                break
        self.final = True
        for name in self.bindings:
            if self.types.get(name) is None and name in self.e.seeds:
                self.types[name] = self.e.seeds[name]

    # -- names ---------------------------------------------------------------------------------

    def lookup(self, name: str) -> Ty | None:
        if name in self.extra:
            return self.extra[name]
        if name in self.globals or (self.fn is None and name in self.bindings):
            return self.e.global_type(self.module.name, name)
        if name in self.bindings:
            if name in self.types:
                return self.types[name]
            if self.final:
                return None
            raise Pending(name)
        if name in self.params:
            assert self.fn is not None
            return self.e.param_type(self.fn, name)
        if name in self.hidden:
            return None
        return self.e.global_type(self.module.name, name)

    def is_local(self, name: str) -> bool:
        return name in self.bindings or name in self.params or name in self.hidden

    def resolve(self, dotted: str) -> str | None:
        """A dotted name as a path the module imports (`nn.Linear` -> `torch.nn.Linear`)."""
        head = dotted.split(".")[0]
        if (self.fn is not None and self.is_local(head)) or head in self.extra:
            return None
        found = self.module.resolve(dotted)
        if found is None and head not in self.module.assigned:
            return f"builtins.{dotted}"
        return found

    # -- expressions ---------------------------------------------------------------------------

    def typeof(self, node: ast.expr | None) -> Ty | None:
        if node is None:
            return None
        if not (self.final and self.e.recording) or self.extra:
            return self._typeof(node)
        key = id(node)
        if key not in self.memo:
            self.memo[key] = self._typeof(node)
        return self.memo[key]

    def at(self, node: ast.expr, where: ast.AST) -> Ty | None:
        """`node`'s type where `where` runs: a name (or a tuple of names) by the binding that
        reaches there when the function's top level makes that certain (`reaching`), else as
        `typeof` has it."""
        if (
            isinstance(node, ast.Tuple)
            and node.elts
            and all(isinstance(e, ast.Name) for e in node.elts)
        ):
            items = [self.at(e, where) for e in node.elts]
            if all(i is None for i in items):
                return None
            return T("tuple", *(ANY if i is None else i for i in items))
        if not isinstance(node, ast.Name) or self.fn is None or self.extra:
            return self.typeof(node)
        memo = self.final and self.e.recording
        key = (id(node), id(where))
        if memo and key in self.at_memo:
            return self.at_memo[key]
        if self._reaching is None:
            self._reaching = Reaching(self.body, self.bindings)
        found = self._reaching.source(node.id, where)
        try:
            if isinstance(found, Updated):
                ty = self._kept(node.id, found)
            elif found == "param":
                ty = self.e.param_type(self.fn, node.id)
            elif found is not None:
                ty = self._reached(node.id, found)
            else:
                ty = None
        except Pending:
            ty = None
        ty = ty if ty is not None else self.typeof(node)
        if memo:
            self.at_memo[key] = ty
        return ty

    def _reached(self, name: str, found: Source) -> Ty | None:
        """The type `found` gives `name`, the local names its value reads taken where it
        stands too (`model = distributed.wrap(model)` after `model = set_up(...)`, where a later
        `model = reload()` of another type leaves `model` no flow-insensitive type)."""
        kind, value, _ = found
        reads: dict[str, ast.Name] = {}
        if kind == "value" and isinstance(value, ast.expr):
            todo: list[ast.AST] = [value]
            while todo:
                node = todo.pop()
                if isinstance(node, (ast.Lambda, *COMPREHENSIONS)):
                    continue  # their own variables
                if (
                    isinstance(node, ast.Name)
                    and isinstance(node.ctx, ast.Load)
                    and node.id in self.bindings
                ):
                    reads.setdefault(node.id, node)
                todo.extend(ast.iter_child_nodes(node))
        known_here = {}
        for read, at_node in reads.items():
            ty = self.at(at_node, at_node)
            if ty is not None:
                known_here[read] = ty
        if not known_here:
            return self._source_type(name, found)
        saved = self.extra
        self.extra = {**saved, **known_here}
        try:
            return self._source_type(name, found)
        finally:
            self.extra = saved

    def _kept(self, name: str, found: Updated) -> Ty | None:
        """The type of the assignment `found` starts from, when each of its updates gives that
        type again with `name` holding it (`x = torch.tensor(xs)`, then in a branch
        `x = (x - x.mean()) / x.std()`: a tensor either way)."""
        assert self.fn is not None
        if found.base == "param":
            ty = self.e.param_type(self.fn, name)
        else:
            ty = self._source_type(name, found.base)
        if ty is None or ty.name in ("|", "typing.Any"):
            return None
        saved = self.extra
        self.extra = {**saved, name: ty}
        try:
            if all(self._source_type(name, s) == ty for s in found.updates):
                return ty
            return None
        finally:
            self.extra = saved

    def _typeof(self, node: ast.expr) -> Ty | None:
        if isinstance(node, ast.Constant):
            return constant(node.value)
        if isinstance(node, ast.JoinedStr):
            return STR
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            return self.e.call_type(self, node)
        if isinstance(node, ast.BinOp):
            return binop(self.typeof(node.left), node.op, self.typeof(node.right))
        if isinstance(node, ast.UnaryOp):
            return BOOL if isinstance(node.op, ast.Not) else self.typeof(node.operand)
        if isinstance(node, ast.Compare):
            sides = [self.typeof(n) for n in (node.left, *node.comparators)]
            if TENSOR in sides or NDARRAY in sides:
                return TENSOR if TENSOR in sides else NDARRAY
            return BOOL if all(s is not None and not s.is_class for s in sides) else None
        if isinstance(node, ast.BoolOp):
            values = [self.typeof(v) for v in node.values]
            return values[0] if all(v == values[0] for v in values) else None
        if isinstance(node, ast.IfExp):
            return join([self.typeof(node.body), self.typeof(node.orelse)], self.e.pkg.ancestors)
        if isinstance(node, ast.Tuple):
            items = [self.typeof(e) for e in node.elts]
            if any(isinstance(e, ast.Starred) for e in node.elts) or items.count(None) == len(
                items
            ):
                return None
            return T("tuple", *(ANY if i is None else i for i in items))
        if isinstance(node, ast.List | ast.Set) and node.elts:
            inner = join([self.typeof(e) for e in node.elts], self.e.pkg.ancestors)
            kind = "list" if isinstance(node, ast.List) else "set"
            return T(kind, inner) if inner is not None and inner != NONE else None
        if isinstance(node, ast.Dict) and node.keys and None not in node.keys:
            key = join([self.typeof(k) for k in node.keys])
            value = join([self.typeof(v) for v in node.values], self.e.pkg.ancestors)
            return T("dict", key, value) if key and value else None
        if isinstance(node, ast.ListComp | ast.SetComp):
            inner = self._comprehension(node.generators, node.elt)
            kind = "list" if isinstance(node, ast.ListComp) else "set"
            return T(kind, inner) if inner is not None else None
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.NamedExpr):
            return self.typeof(node.value)
        return None

    def _comprehension(self, generators: list[ast.comprehension], elt: ast.expr) -> Ty | None:
        saved = dict(self.extra)
        try:
            for gen in generators:
                names = [n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)]
                ty = self.item_type(gen.iter) if isinstance(gen.target, ast.Name) else None
                self.extra.update(dict.fromkeys(names, ty))
            ty = self.typeof(elt)
            return ty if ty != NONE else None
        finally:
            self.extra = saved

    def item_type(self, node: ast.expr) -> Ty | None:
        """The type of the items of `for ... in node`."""
        if isinstance(node, ast.Call) and node.args and not node.keywords:
            name = dotted_name(node.func)
            path = self.resolve(name) if name else None
            if path == "builtins.enumerate" and len(node.args) == 1:
                item = self.item_type(node.args[0])
                return T("tuple", INT, item) if item else None
            if path == "builtins.zip":
                items = [self.item_type(a) for a in node.args]
                return T("tuple", *items) if None not in items else None  # type: ignore[arg-type]
            if path in ("tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "builtins.reversed"):
                return self.item_type(node.args[0])
        return element(self.typeof(node))

    def _attribute(self, node: ast.Attribute) -> Ty | None:
        name = dotted_name(node)
        if name is not None:
            path = self.resolve(name)
            if path is not None and not path.startswith("builtins."):
                if path.startswith("."):
                    module, _, attr = path[1:].rpartition(".")
                    return (
                        self.e.global_type(module, attr) if module in self.e.pkg.modules else None
                    )
                return known.module_attribute_type(path)
        receiver = self.typeof(node.value)
        if receiver is None:
            return None
        if receiver.name in self.e.pkg.classes:
            return self.e.attribute(receiver.name, node.attr)
        return known.attribute_type(receiver, node.attr)

    def _subscript(self, node: ast.Subscript) -> Ty | None:
        value = self.typeof(node.value)
        if value is None:
            return None
        if value == TENSOR:
            return TENSOR
        index = node.slice
        if value.name == "tuple" and value.args:
            if len(value.args) == 2 and value.args[1].name == ELLIPSIS:
                return value if isinstance(index, ast.Slice) else value.args[0]
            if isinstance(index, ast.Constant) and isinstance(index.value, int):
                return item(value, index.value)
            return None
        if value.name == "list" and value.args:
            return value if isinstance(index, ast.Slice) else value.args[0]
        if value.name == "dict" and len(value.args) == 2:
            return value.args[1]
        if value == STR or (value == T("torch.Size") and not isinstance(index, ast.Slice)):
            return STR if value == STR else INT
        return None

    # -- results -------------------------------------------------------------------------------

    def return_type(self) -> Ty | None:
        assert self.fn is not None
        node = self.fn.node
        if self._returns is None:
            self._returns = own(node, (ast.Return, ast.Yield, ast.YieldFrom))
        mine = self._returns
        if any(isinstance(n, ast.Yield | ast.YieldFrom) for n in mine):
            return None
        returns = [n for n in mine if isinstance(n, ast.Return)]
        if not any(r.value is not None for r in returns):
            return NONE
        found = [self.at(r.value, r) if r.value is not None else NONE for r in returns]
        if not terminates(node.body):
            found.append(NONE)
        return join(found, self.e.pkg.ancestors)
