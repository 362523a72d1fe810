"""
Types as the annotation steps see them: a small immutable tree (`Ty`), the join of several types
(the nearest common base past one member), reading a written annotation, and writing a type into
one module of the package with the imports it needs.

A class is named by its canonical dotted path: `torch.optim.AdamW` for a third-party class (the
path the notebook imported it by), `.model.SmallNet` (a leading dot) for a class of the package.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import libcst as cst

from .cut import insert_after_imports

BUILTINS = frozenset(
    {"int", "float", "str", "bool", "bytes", "complex", "None", "range", "object", "slice"}
)
GENERICS = frozenset({"list", "tuple", "dict", "set", "frozenset", "type"})
UNION = "|"
ELLIPSIS = "..."
# third-party families whose members share a base the join may use
FAMILIES = (
    ("torch.optim.lr_scheduler.", "torch.optim.lr_scheduler.LRScheduler"),
    ("torch.optim.", "torch.optim.Optimizer"),
    ("torch.nn.", "torch.nn.Module"),
)


@dataclass(frozen=True)
class Ty:
    name: str  # "int", "list", "torch.Tensor", ".model.SmallNet", "|" (a union)
    args: tuple[Ty, ...] = ()

    def __str__(self) -> str:
        if self.name == UNION:
            return " | ".join(map(str, self.args))
        if self.args:
            return f"{self.name}[{', '.join(map(str, self.args))}]"
        return self.name

    @property
    def is_class(self) -> bool:
        return self.name not in BUILTINS | GENERICS | {UNION, ELLIPSIS}


def T(name: str, *args: Ty) -> Ty:
    return Ty(name, args)


INT, FLOAT, STR, BOOL, NONE = T("int"), T("float"), T("str"), T("bool"), T("None")
# An element of a tuple whose own type is unknown: `tuple[Any, DataLoader]` still types what is
# unpacked from its known elements (`flow.item` never hands `Any` on to a name).
ANY = T("typing.Any")
TENSOR = T("torch.Tensor")
NDARRAY = T("numpy.ndarray")
DATAFRAME = T("pandas.DataFrame")


def element(ty: Ty | None) -> Ty | None:
    """The type of an item of `ty` when iterated (`list[int]` -> int, a tensor -> a tensor)."""
    if ty is None:
        return None
    if ty.name in ("list", "set", "frozenset", "dict") and ty.args:
        return ty.args[0]
    if ty.name == "tuple" and ty.args:
        if len(ty.args) == 2 and ty.args[1].name == ELLIPSIS:
            return ty.args[0]
        return join(ty.args)
    if ty.name == "range":
        return INT
    if ty.name == "str":
        return STR
    if ty == TENSOR:
        return TENSOR
    return None


def join(
    types: Iterable[Ty | None], ancestors: Callable[[str], list[str]] | None = None
) -> Ty | None:
    """One type for all of `types` (None if one is unknown or they share nothing sound)."""
    found: list[Ty] = []
    for ty in types:
        if ty is None:
            return None
        for one in ty.args if ty.name == UNION else (ty,):
            if one not in found:
                found.append(one)
    if not found:
        return None
    optional = NONE in found
    rest = [t for t in found if t != NONE]
    if len(rest) > 1:
        single = _join_many(rest, ancestors or family_chain)
        if single is None:
            return None
        rest = [single]
    if not rest:
        return NONE
    if optional:
        return T(UNION, *(rest[0].args if rest[0].name == UNION else rest), NONE)
    return rest[0]


def _join_many(rest: list[Ty], ancestors: Callable[[str], list[str]]) -> Ty | None:
    names = {t.name for t in rest}
    if names <= {"int", "float", "bool"}:
        return FLOAT if "float" in names else INT
    if len(names) == 1 and rest[0].name in ("list", "set") and all(t.args for t in rest):
        inner = join([t.args[0] for t in rest], ancestors)
        return T(rest[0].name, inner) if inner is not None and inner != NONE else None
    if len(names) == 1 and rest[0].name == "tuple":
        sizes = {len(t.args) for t in rest}
        if len(sizes) != 1:
            return None
        items = [join([t.args[i] for t in rest], ancestors) for i in range(sizes.pop())]
        return T("tuple", *items) if all(i is not None for i in items) else None  # type: ignore[arg-type]
    if all(t.is_class and not t.args for t in rest):
        chains = [ancestors(t.name) for t in rest]
        for candidate in chains[0]:
            if all(candidate in chain for chain in chains[1:]):
                if candidate == MODULE and all(t.name[0] == "." for t in rest):
                    # the package's own models (RL-Adventure's `current_model`, a `RainbowDQN`
                    # and later a `RainbowCnnDQN`): `nn.Module` has none of their methods
                    # (mypy reads `model.act` as `Tensor | Module`), their union has them; a
                    # member that derives from another is in it already
                    members = [
                        t
                        for t, chain in zip(rest, chains, strict=True)
                        if not any(o.name != t.name and o.name in chain for o in rest)
                    ]
                    if len(members) <= 3:
                        return T(UNION, *sorted(members, key=lambda t: t.name))
                return T(candidate)
    return None


MODULE = "torch.nn.Module"


def family_chain(name: str) -> list[str]:
    """`torch.optim.AdamW` -> [itself, `torch.optim.Optimizer`] (third-party classes only)."""
    for prefix, base in FAMILIES:
        last = name.rsplit(".", 1)[-1]
        if name.startswith(prefix) and last[:1].isupper():
            return [name, base] if name != base else [name]
    return [name]


def parse_annotation(node: ast.expr | None, resolve: Callable[[str], str | None]) -> Ty | None:
    """A written annotation -> `Ty` (names through `resolve`); None where it is not simple."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        if node.value is None:
            return NONE
        if node.value is Ellipsis:
            return T(ELLIPSIS)
        if isinstance(node.value, str):
            try:
                return parse_annotation(ast.parse(node.value, mode="eval").body, resolve)
            except SyntaxError:
                return None
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = (parse_annotation(n, resolve) for n in (node.left, node.right))
        if left is None or right is None:
            return None
        parts = [*(left.args if left.name == UNION else (left,))]
        parts += [*(right.args if right.name == UNION else (right,))]
        return T(UNION, *parts)
    if isinstance(node, ast.Subscript):
        base = parse_annotation(node.value, resolve)
        if base is None or base.args:
            return None
        name = base.name.removeprefix("typing.").lower()
        if name not in GENERICS:
            return None
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        args = [parse_annotation(i, resolve) for i in items]
        return T(name, *args) if all(a is not None for a in args) else None  # type: ignore[arg-type]
    dotted = dotted_name(node)
    if dotted is None:
        return None
    if dotted in BUILTINS or dotted in GENERICS:
        return T(dotted)
    full = resolve(dotted)
    return T(full) if full else None


def dotted_name(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


@dataclass
class Renderer:
    """Writes types into one module: by a name the module binds (`torch.optim.SGD` where it
    imports `torch`), else through a new import (`from torch.optim import SGD`; always so with
    `short`, the form the `--execute` types are written in).

    `bound` maps each name the module binds to what it is (`nn` -> `torch.nn`, `SmallNet` ->
    `.model.SmallNet`); `module` is the module's own name. The imports the annotations need are
    collected in `imports` (to go under `if TYPE_CHECKING:`).
    """

    module: str
    bound: dict[str, str]
    imports: set[str]
    taken: frozenset[str] = frozenset()  # names the module uses otherwise (`device` a variable)
    short: bool = False  # `from torch.optim import AdamW` and `AdamW` even where `torch` is bound

    def __call__(self, ty: Ty) -> str:
        if ty.name == UNION:
            return " | ".join(self(a) for a in ty.args)
        if ty.args:
            return f"{ty.name}[{', '.join(self(a) for a in ty.args)}]"
        if not ty.is_class:
            return ty.name
        return self.name(ty.name)

    def name(self, full: str) -> str:
        for local, target in self.bound.items():
            if target == full:
                return local
        head, _, last = full.rpartition(".")
        if full.startswith("."):  # a class of the package
            if head == f".{self.module}":
                return last
            if last in self.taken or last in self.bound:  # the name means something else here
                self.imports.add(f"from {head} import {last} as {last}_")
                self.bound[f"{last}_"] = full
                return f"{last}_"
            self.imports.add(f"from {head} import {last}")
            self.bound[last] = full
            return last
        through = self._through(full)
        if through is not None and not self.short:
            return through
        if last not in self.bound and last not in self.taken:
            self.imports.add(f"from {head} import {last}")
            self.bound[last] = full
            return last
        if through is not None:
            return through
        top = head.split(".")[0]
        self.imports.add(f"import {head}")
        self.bound.setdefault(top, top)
        return full

    def _through(self, full: str) -> str | None:
        """`torch.optim.SGD` where the module imports `torch` (a module it binds, longest first)."""
        for local, target in sorted(self.bound.items(), key=lambda kv: -len(kv[1])):
            if full.startswith(target + ".") and not target.startswith("."):
                return local + full[len(target) :]
        return None


def add_imports(
    tree: cst.Module, lines: set[str], guarded: bool = True, have_flag: bool = False
) -> cst.Module:
    """`lines` after the module's last top-level import, under `if TYPE_CHECKING:` if guarded
    (`have_flag`: the module imports `TYPE_CHECKING` already)."""
    if not lines:
        return tree
    last = max(
        (
            i
            for i, s in enumerate(tree.body)
            if isinstance(s, cst.SimpleStatementLine)
            and len(s.body) == 1
            and isinstance(s.body[0], cst.Import | cst.ImportFrom)
        ),
        default=-1,
    )
    block = _import_block(lines, guarded, have_flag)
    return tree.with_changes(body=[*tree.body[: last + 1], *block, *tree.body[last + 1 :]])


def _import_block(
    lines: set[str], guarded: bool, have_flag: bool
) -> list[cst.SimpleStatementLine | cst.BaseCompoundStatement]:
    if guarded:
        flag = "" if have_flag else "from typing import TYPE_CHECKING\n\n"
        text = flag + "if TYPE_CHECKING:\n" + "".join(f"    {line}\n" for line in sorted(lines))
    else:
        text = "".join(f"{line}\n" for line in sorted(lines))
    block = list(cst.parse_module(text).body)
    if guarded:
        block[-1] = block[-1].with_changes(leading_lines=[cst.EmptyLine()])
    return block


def add_imports_text(
    code: str, lines: set[str], guarded: bool = True, have_flag: bool = False
) -> str:
    """`add_imports(cst.parse_module(code), lines, guarded, have_flag).code` without parsing
    the module: the block goes in as text after its last import (`cut.insert_after_imports`),
    indented as libcst would indent it there, by the module's first indentation."""
    if not lines:
        return code
    block = _import_block(lines, guarded, have_flag)
    text = cst.Module(body=block, default_indent=_default_indent(code)).code
    return insert_after_imports(
        code, text, lambda tree: add_imports(tree, lines, guarded, have_flag)
    )


def _default_indent(code: str) -> str:
    """The whitespace of the first indented line of `code`, as libcst's parser takes it for a
    module's `default_indent` (four spaces when there is none)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.INDENT:
                return token.string
    except (tokenize.TokenError, SyntaxError):
        pass
    return "    "


def map_params(params: cst.Parameters, change: Callable[[cst.Param], cst.Param]) -> cst.Parameters:
    """`params` with `change` applied to each named parameter (positional-only, positional or
    keyword, keyword-only; not `*args` and `**kwargs`)."""
    return params.with_changes(
        posonly_params=[change(p) for p in params.posonly_params],
        params=[change(p) for p in params.params],
        kwonly_params=[change(p) for p in params.kwonly_params],
    )


class ByQualname(cst.CSTTransformer):
    """Keeps the enclosing classes, so `qualname(fn)` is `Class.method` as the trace names it."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def qualname(self, fn: cst.FunctionDef) -> str:
        return ".".join([*self.stack, fn.name.value])

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.append(node.name.value)

    def leave_ClassDef(
        self, original_node: cst.ClassDef, updated_node: cst.ClassDef
    ) -> cst.ClassDef:
        self.stack.pop()
        return updated_node
