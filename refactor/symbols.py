"""
The package's symbols, read from the written modules (Python's `ast`: fast, and any function an
earlier step wrote is seen the same way): what each module binds (its imports, functions,
classes, globals), every function and method by qualified name, and each class's bases.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .cut import parsed
from .typeexpr import dotted_name

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Function:
    module: str
    qualname: str  # "fit", "SmallNet.forward"
    node: FunctionNode
    cls: str | None  # the canonical name of its class (".model.SmallNet"), None for a function

    @property
    def key(self) -> str:
        return f".{self.module}.{self.qualname}"

    @property
    def params(self) -> list[ast.arg]:
        """Parameters that take arguments by name or position, `self`/`cls` left out."""
        a = self.node.args
        found = [*a.posonlyargs, *a.args]
        if self.cls is not None and found and not _static(self.node):
            found = found[1:]
        return [*found, *a.kwonlyargs]

    @property
    def positional(self) -> list[ast.arg]:
        a = self.node.args
        found = [*a.posonlyargs, *a.args]
        return found[1:] if self.cls is not None and found and not _static(self.node) else found

    def default(self, name: str) -> ast.expr | None:
        a = self.node.args
        positional = [*a.posonlyargs, *a.args]
        offset = len(positional) - len(a.defaults)
        for i, arg in enumerate(positional):
            if arg.arg == name and i >= offset:
                return a.defaults[i - offset]
        for arg, value in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            if arg.arg == name:
                return value
        return None


def _static(fn: FunctionNode) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


@dataclass(frozen=True)
class Class:
    key: str  # ".model.SmallNet"
    node: ast.ClassDef
    bases: tuple[str, ...]  # canonical names
    methods: dict[str, Function]
    fields: dict[str, ast.expr]  # annotated class attributes: name -> annotation


@dataclass
class Module:
    name: str
    tree: ast.Module
    bound: dict[str, str] = field(default_factory=dict)  # local name -> canonical
    assigned: dict[str, list[ast.expr]] = field(default_factory=dict)  # module globals

    def resolve(self, dotted: str) -> str | None:
        """`nn.Linear` -> `torch.nn.Linear` through what this module binds."""
        head, _, rest = dotted.partition(".")
        target = self.bound.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target


@dataclass(frozen=True)
class Package:
    modules: dict[str, Module]
    functions: dict[str, Function]  # by key (".train.fit", ".model.SmallNet.forward")
    classes: dict[str, Class]  # by key

    def method(self, cls: str, name: str) -> Function | None:
        """`name` looked up on a package class and its package bases, in order."""
        seen: set[str] = set()
        todo = [cls]
        while todo:
            key = todo.pop(0)
            if key in seen or key not in self.classes:
                continue
            seen.add(key)
            found = self.classes[key].methods.get(name)
            if found is not None:
                return found
            todo += list(self.classes[key].bases)
        return None

    def ancestors(self, name: str) -> list[str]:
        """A class and its bases, nearest first (package classes through their written bases)."""
        from .typeexpr import family_chain

        chain: list[str] = []
        todo = [name]
        while todo:
            key = todo.pop(0)
            if key in chain:
                continue
            if key in self.classes:
                chain.append(key)
                todo += list(self.classes[key].bases)
            else:
                chain += [c for c in family_chain(key) if c not in chain]
        return chain

    def is_module(self, name: str) -> bool:
        """An `nn.Module` (a package class deriving from one, or a `torch.nn` class)."""
        return "torch.nn.Module" in self.ancestors(name)


def index(files: dict[str, str], package: str) -> Package:
    """Parse the package's modules (`PKG/x.py` in `files`) and list their symbols."""
    modules: dict[str, Module] = {}
    for path, code in sorted(files.items()):
        if not path.startswith(f"{package}/") or not path.endswith(".py") or path.count("/") != 1:
            continue
        name = path[len(package) + 1 : -3]
        tree = parsed(code)  # shared with the other steps that parse this code: not changed here
        if tree is None:
            continue
        if any(m.tree is tree for m in modules.values()):  # two modules of the same code
            tree = ast.parse(code)
        modules[name] = _module(name, tree)
    functions: dict[str, Function] = {}
    classes: dict[str, Class] = {}
    for module in modules.values():
        for node in module.tree.body:
            if isinstance(node, FunctionNode):
                fn = Function(module.name, node.name, node, None)
                functions[fn.key] = fn
            elif isinstance(node, ast.ClassDef):
                key = f".{module.name}.{node.name}"
                methods = {
                    s.name: Function(module.name, f"{node.name}.{s.name}", s, key)
                    for s in node.body
                    if isinstance(s, FunctionNode)
                }
                functions.update({f.key: f for f in methods.values()})
                bases = tuple(
                    module.resolve(d) or d
                    for d in (dotted_name(b) for b in node.bases)
                    if d is not None
                )
                fields = {
                    s.target.id: s.annotation
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                }
                classes[key] = Class(key, node, bases, methods, fields)
    return Package(modules, functions, classes)


def _module(name: str, tree: ast.Module) -> Module:
    module = Module(name, tree)
    for node in _top_level(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    module.bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = ("." * node.level) + (node.module or "")
            for alias in node.names:
                if alias.name != "*":
                    sep = "" if base.endswith(".") else "."
                    module.bound[alias.asname or alias.name] = f"{base}{sep}{alias.name}"
        elif isinstance(node, FunctionNode | ast.ClassDef):
            module.bound[node.name] = f".{name}.{node.name}"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and node.value is not None:
                    module.assigned.setdefault(target.id, []).append(node.value)
    return module


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module statements, with those under `if TYPE_CHECKING:` / `try:` blocks flattened."""
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            found += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _top_level(node.body)
        else:
            found.append(node)
    return found
