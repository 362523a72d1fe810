"""
Step 5: type annotations, applied with libcst's `ApplyTypeAnnotationsVisitor` from a stub made
for each module.

Without running anything: a parameter with a literal default has that literal's type (the
parameters made from notebook constants too), a function that never returns a value returns
`None`, an `nn.Module`'s `__init__` returns `None` and its `forward` takes and returns tensors
when its body returns a single value, a Dataset's `__len__` returns `int` and `__getitem__` takes
an `int`, and a parameter made from notebook state has the type of the constructor the notebook
built it with (`model = SmallNet()`, `DataLoader(...)`, `torch.optim.AdamW(...)`).

With `--execute`, the types recorded while the notebook ran (see `trace`) come first: the union
of what each parameter received and each function returned, shrunk to the nearest common base
class past three members, tensors as `torch.Tensor` with their dtypes and shapes written into
the docstring. A type that was seen is never written as `Any`; a callable argument is left
unannotated (no sound signature was observed). The report gives the share of annotated
parameters and returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import ApplyTypeAnnotationsVisitor

from .plan import Plan

LITERAL_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}
MODULE_BASES = re.compile(r"(^|\.)(Module|Sequential)$")
DATASET_BASES = re.compile(r"(^|\.)(Dataset|IterableDataset)$")
CONSTRUCTORS = {  # a notebook call's dotted name -> the type it builds (for state parameters)
    "torch.device": "torch.device",
    "resolve_device": "torch.device",
    "torch.utils.data.DataLoader": "torch.utils.data.DataLoader",
    "torch.Generator": "torch.Generator",
}


@dataclass
class Signature:
    params: dict[str, str] = field(default_factory=dict)
    returns: str | None = None
    shapes: list[str] = field(default_factory=list)  # "x: float32[64, 3, 8, 8]" lines


@dataclass
class Coverage:
    annotated: int = 0
    total: int = 0

    @property
    def share(self) -> float:
        return self.annotated / self.total if self.total else 1.0


def _literal_type(value: object) -> str | None:
    if isinstance(value, list | tuple) and value:
        inner = LITERAL_TYPES.get(type(value[0]))
        return (
            f"{type(value).__name__}[{inner}{', ...' if isinstance(value, tuple) else ''}]"
            if inner
            else None
        )
    return LITERAL_TYPES.get(type(value))


class Types:
    """The signatures to apply, by qualified name (`fit`, `SmallNet.forward`)."""

    def __init__(
        self,
        plan: Plan,
        trace: dict[str, list[dict[str, Any]]] | None,
        globals_seen: dict[str, Any] | None = None,
    ) -> None:
        self.plan = plan
        self.trace = trace or {}
        self.globals_seen = globals_seen or {}  # --execute: each global's type at the end
        self.package_classes = {
            n
            for n, p in plan.placed.items()
            if n not in plan.in_run and isinstance(p.item.node, cst.ClassDef)
        }
        self.state_types = self._state_types()

    # -- from the notebook's own code --------------------------------------------------------

    def _aliases(self) -> dict[str, str]:
        """Imported names -> dotted origin (`nn` -> `torch.nn`, `DataLoader` -> `torch.utils...`)."""
        found: dict[str, str] = {}
        for item in self.plan.imports:
            small = item.node.body[0]  # type: ignore[attr-defined]
            if isinstance(small, cst.Import):
                for alias in small.names:
                    dotted = cst.Module([]).code_for_node(alias.name)
                    name = alias.asname.name.value if alias.asname else dotted.split(".")[0]  # type: ignore[union-attr]
                    found[name] = dotted if alias.asname else dotted.split(".")[0]
            elif (
                isinstance(small, cst.ImportFrom)
                and small.module is not None
                and not small.relative
            ):
                base = cst.Module([]).code_for_node(small.module)
                if isinstance(small.names, cst.ImportStar):
                    continue
                for alias in small.names:
                    name = cst.Module([]).code_for_node(alias.name)
                    local = alias.asname.name.value if alias.asname else name  # type: ignore[union-attr]
                    found[local] = f"{base}.{name}"
        return found

    def _state_types(self) -> dict[str, str]:
        """`model = SmallNet()` -> {"model": "SmallNet"}; only names bound once, by a known call."""
        aliases = self._aliases()
        types: dict[str, str] = {}
        counts: dict[str, int] = {}
        for item in self.plan.run_body:
            for name in item.binds:
                counts[name] = counts.get(name, 0) + 1
            node = item.node
            if not (
                isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Assign)
            ):
                continue
            assign = node.body[0]
            if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
                continue
            value = assign.value
            while (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in ("to", "cuda", "cpu")
            ):
                value = value.func.value  # SmallNet().to(device) is a SmallNet
            if not isinstance(value, cst.Call):
                continue
            dotted = cst.Module([]).code_for_node(value.func)
            head, _, rest = dotted.partition(".")
            full = f"{aliases[head]}.{rest}".rstrip(".") if head in aliases else dotted
            if dotted in self.package_classes:
                types[assign.targets[0].target.value] = dotted
            elif full in CONSTRUCTORS or dotted in CONSTRUCTORS:
                types[assign.targets[0].target.value] = CONSTRUCTORS.get(
                    full, CONSTRUCTORS.get(dotted, "")
                )
            elif (
                full.startswith(("torch.optim.", "torch.nn.")) and full.split(".")[-1][:1].isupper()
            ):
                types[assign.targets[0].target.value] = full
        if self.plan.device:
            types["device"] = "torch.device"
        return {n: t for n, t in types.items() if counts.get(n, 0) <= 1 and t}

    def value_type(self, name: str) -> str | None:
        """The type of a notebook global: a constant's literal type, or its constructor's."""
        constant = self.plan.constants.get(name)
        if constant is not None:
            return _literal_type(constant.value)
        if name in self.state_types:
            return self.state_types[name]
        seen = self.globals_seen.get(name)
        return self._one(seen) if seen is not None else None

    def static(self, qualname: str, fn: cst.FunctionDef, cls: cst.ClassDef | None) -> Signature:
        sig = Signature()
        placed = self.plan.placed.get(qualname.split(".")[0])
        injected = {p.name: p for p in placed.params} if placed else {}
        for param in [*fn.params.params, *fn.params.kwonly_params]:
            name = param.name.value
            if param.annotation is not None:
                continue
            made = injected.get(name)
            if made is not None and made.default is not None:
                value = self.plan.constants[made.default].value
                typed = _literal_type(value)
            elif made is not None:
                typed = self.state_types.get(made.source)
            elif param.default is not None:
                typed = _default_type(param.default)
            else:
                typed = None
            if typed:
                sig.params[name] = typed
        bases = [cst.Module([]).code_for_node(b.value) for b in cls.bases] if cls else []
        method = fn.name.value
        if cls is not None and any(MODULE_BASES.search(b) for b in bases) and method == "forward":
            for param in fn.params.params[1:]:
                if param.default is None and param.annotation is None:
                    sig.params.setdefault(param.name.value, "torch.Tensor")
            if _returns_single_value(fn):
                sig.returns = "torch.Tensor"
        if cls is not None and any(DATASET_BASES.search(b) for b in bases):
            if method == "__len__":
                sig.returns = "int"
            if method == "__getitem__" and len(fn.params.params) > 1:
                sig.params.setdefault(fn.params.params[1].name.value, "int")
        if fn.returns is None and sig.returns is None and not _returns_value(fn):
            sig.returns = "None"
        return sig

    # -- from the traced run -------------------------------------------------------------------

    def traced(self, qualname: str) -> Signature:
        sig = Signature()
        calls = self.trace.get(qualname, [])
        if not calls:
            return sig
        names = list(calls[0]["args"])
        for name in names:
            seen = [c["args"][name] for c in calls if name in c["args"]]
            typed = self._union(seen)
            if typed:
                sig.params[name] = typed
            sig.shapes += _shapes(name, seen)
        sig.returns = self._union([c["return"] for c in calls])
        sig.shapes += _shapes("returns", [c["return"] for c in calls])
        return sig

    def _one(self, d: dict[str, Any]) -> str | None:
        kind = d.get("kind")
        if kind == "tensor":
            return "torch.Tensor"
        if kind == "tuple":
            items = [self._one(i) for i in d["items"]]
            known = [i for i in items if i is not None]
            if not items:
                return "tuple[()]"
            return f"tuple[{', '.join(known)}]" if len(known) == len(items) else None
        if kind != "object":
            return None  # callables: no signature was observed
        name = str(d["type"])
        if name in ("NoneType", "builtins.NoneType"):
            return "None"
        if name.startswith("__main__."):
            short = str(name).removeprefix("__main__.")
            if short in self.package_classes:
                return short
            for base in d.get("bases", []):
                if not base.startswith(("__main__.", "typing.")):
                    return str(base)
            return None
        if name == "list" and "item" in d:
            inner = self._one(d["item"])
            return f"list[{inner}]" if inner else "list"
        if name in ("list", "dict", "set", "tuple"):
            return str(name)
        return str(name)

    def _union(self, seen: list[dict[str, Any]]) -> str | None:
        types: list[str] = []
        for d in seen:
            one = self._one(d)
            if one is None:
                return None
            if one not in types:
                types.append(one)
        if not types:
            return None
        optional = "None" in types
        rest = [t for t in types if t != "None"]
        if len(rest) > 3:  # shrink: the nearest base class every value shares
            common = self._common_base(seen)
            if common is None:
                return None
            rest = [common]
        if "float" in rest and "int" in rest:
            rest.remove("int")  # an int is accepted where a float is
        text = " | ".join(rest) if rest else "None"
        return f"{text} | None" if optional and rest else text

    def _common_base(self, seen: list[dict[str, Any]]) -> str | None:
        chains = [
            [d.get("type", ""), *d.get("bases", [])] for d in seen if d.get("kind") == "object"
        ]
        if len(chains) != len(seen):
            return None
        for candidate in chains[0]:
            if all(candidate in chain for chain in chains) and not candidate.startswith(
                ("__main__.", "typing.")
            ):
                return str(candidate)
        return None

    def signature(self, qualname: str, fn: cst.FunctionDef, cls: cst.ClassDef | None) -> Signature:
        static = self.static(qualname, fn, cls)
        traced = self.traced(qualname)
        merged = Signature(
            {**static.params, **traced.params}, traced.returns or static.returns, traced.shapes
        )
        if fn.name.value == "__init__":
            merged.returns = "None"
        return merged


def _default_type(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return "bool"
    if isinstance(node, cst.Integer):
        return "int"
    if isinstance(node, cst.Float):
        return "float"
    if isinstance(node, cst.SimpleString):
        return "str"
    if isinstance(node, cst.UnaryOperation) and isinstance(
        node.expression, cst.Integer | cst.Float
    ):
        return _default_type(node.expression)
    return None


def _own_returns(fn: cst.FunctionDef) -> list[cst.Return]:
    """Return statements of `fn` itself, not of functions or lambdas nested in it."""
    found: list[cst.Return] = []

    class Visitor(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fn

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

    fn.visit(Visitor())
    return found


def _returns_value(fn: cst.FunctionDef) -> bool:
    if m.findall(fn, m.Yield()):
        return True
    return any(r.value is not None for r in _own_returns(fn))


def _returns_single_value(fn: cst.FunctionDef) -> bool:
    """Every return gives one value: not None, not a tuple, list or dict display."""
    returns = _own_returns(fn)

    def single(value: cst.BaseExpression | None) -> bool:
        if value is None or isinstance(value, cst.Tuple | cst.List | cst.Dict):
            return False
        return not (isinstance(value, cst.Name) and value.value == "None")

    return bool(returns) and all(single(r.value) for r in returns)


def _shapes(name: str, seen: list[dict[str, Any]]) -> list[str]:
    found = []
    for d in seen:
        if d.get("kind") == "tensor":
            text = f"{d['dtype']}[{', '.join(map(str, d['shape']))}] ({d['device']})"
            if text not in found:
                found.append(text)
    return [f"{name}: {', '.join(found[:3])}"] if found else []


def _param_text(param: cst.Param, annotation: str | None, star: str = "") -> str:
    text = star + param.name.value
    if annotation:
        text += f": {annotation}"
    if param.default is not None:
        text += " = ..."
    return text


def _stub_function(fn: cst.FunctionDef, sig: Signature, indent: str = "") -> str:
    p = fn.params
    parts = [_param_text(x, sig.params.get(x.name.value)) for x in p.posonly_params]
    if p.posonly_params:
        parts.append("/")
    parts += [_param_text(x, sig.params.get(x.name.value)) for x in p.params]
    if isinstance(p.star_arg, cst.Param):
        parts.append(_param_text(p.star_arg, None, "*"))
    elif p.kwonly_params:
        parts.append("*")
    parts += [_param_text(x, sig.params.get(x.name.value)) for x in p.kwonly_params]
    if p.star_kwarg is not None:
        parts.append(_param_text(p.star_kwarg, None, "**"))
    returns = f" -> {sig.returns}" if sig.returns else ""
    return f"{indent}def {fn.name.value}({', '.join(parts)}){returns}: ...\n"


class _ByQualname(cst.CSTTransformer):
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


class _SetAnnotations(_ByQualname):
    """Write the signatures' types into parameters and returns that have none."""

    def __init__(self, signatures: dict[str, Signature]) -> None:
        super().__init__()
        self.signatures = signatures

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # nested functions keep their own (no) annotations

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        sig = self.signatures.get(self.qualname(updated_node))
        if sig is None:
            return updated_node

        def typed(param: cst.Param) -> cst.Param:
            kind = sig.params.get(param.name.value)
            if kind is None or param.annotation is not None:
                return param
            return param.with_changes(annotation=cst.Annotation(cst.parse_expression(kind)))

        p = updated_node.params
        params = p.with_changes(
            posonly_params=[typed(x) for x in p.posonly_params],
            params=[typed(x) for x in p.params],
            kwonly_params=[typed(x) for x in p.kwonly_params],
        )
        returns = updated_node.returns
        if returns is None and sig.returns:
            returns = cst.Annotation(cst.parse_expression(sig.returns))
        return updated_node.with_changes(params=params, returns=returns)


class _ShapeDocs(_ByQualname):
    """Append the traced tensor shapes to the docstrings of the functions they belong to."""

    def __init__(self, shapes: dict[str, list[str]]) -> None:
        super().__init__()
        self.shapes = shapes

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        lines = self.shapes.get(self.qualname(updated_node))
        body = updated_node.body
        if not lines or not isinstance(body, cst.IndentedBlock) or not body.body:
            return updated_node
        first = body.body[0]
        text = "Tensor shapes seen when the notebook ran (dtype[shape] (device)):\n\n" + "\n".join(
            f"- {line}" for line in lines
        )
        if (
            isinstance(first, cst.SimpleStatementLine)
            and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, cst.SimpleString)
        ):
            old = first.body[0].value
            quote = old.value[-3:] if old.value.endswith(('"""', "'''")) else None
            if quote is None:
                return updated_node
            inner = old.value[:-3].rstrip()
            new = cst.SimpleString(f"{inner}\n\n{text}\n{quote}")
            statement = first.with_changes(body=[first.body[0].with_changes(value=new)])
            return updated_node.with_changes(
                body=body.with_changes(body=[statement, *body.body[1:]])
            )
        doc = cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{text}\n"""'))])
        return updated_node.with_changes(body=body.with_changes(body=[doc, *body.body]))


def annotate_module(code: str, module: str, types: Types) -> str:
    """`code` (one module of the package) with the signatures of `types` applied."""
    tree = cst.parse_module(code)
    stub_lines: list[str] = ["import torch\n"]
    shapes: dict[str, list[str]] = {}
    signatures: dict[str, Signature] = {}
    for statement in tree.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value in types.plan.placed:
            sig = types.signature(statement.name.value, statement, None)
            signatures[statement.name.value] = sig
            stub_lines.append(_stub_function(statement, sig))
            if sig.shapes:
                shapes[statement.name.value] = sig.shapes
        elif isinstance(statement, cst.ClassDef) and statement.name.value in types.plan.placed:
            methods = [s for s in statement.body.body if isinstance(s, cst.FunctionDef)]
            if not methods:
                continue
            stub_lines.append(f"class {statement.name.value}:\n")
            for fn in methods:
                qualname = f"{statement.name.value}.{fn.name.value}"
                sig = types.signature(qualname, fn, statement)
                signatures[qualname] = sig
                stub_lines.append(_stub_function(fn, sig, "    "))
                if sig.shapes:
                    shapes[qualname] = sig.shapes
    used = {
        name
        for line in stub_lines
        for name in re.findall(r"\b([A-Z]\w*)\b", line)
        if name in types.package_classes and types.plan.module_of(name) != module
    }
    for name in sorted(used):
        stub_lines.insert(0, f"from .{types.plan.module_of(name)} import {name}\n")
    if not types.trace:
        # Static types only: a direct transformer sets them (the visitor below, for the traced
        # types, costs about 9 ms per notebook cell: 2.2x the whole refactor of 500 cells).
        annotated = tree.visit(_SetAnnotations(signatures))
        text = annotated.code
        if "torch." in text and not re.search(r"^import torch$", text, re.M):
            text = text.replace(
                "from __future__ import annotations\n",
                "from __future__ import annotations\n\nimport torch\n",
                1,
            )
        imports = "".join(line for line in stub_lines if line.startswith("from ."))
        return _type_only_relative_imports(text, code, imports.splitlines())
    # The visitor walks every node: hide the bodies of the functions it has nothing for (`run()`
    # holds the whole notebook) and put them back afterwards.
    stubbed = {line.split("(")[0].split()[-1] for line in stub_lines if line.startswith("def ")}
    hidden: dict[str, cst.BaseSuite] = {}
    body: list[cst.BaseStatement] = []
    for statement in tree.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value not in stubbed:
            hidden[statement.name.value] = statement.body
            statement = statement.with_changes(body=cst.SimpleStatementSuite([cst.Pass()]))
        body.append(statement)
    context = CodemodContext()
    ApplyTypeAnnotationsVisitor.store_stub_in_context(
        context, cst.parse_module("".join(stub_lines))
    )
    annotated = ApplyTypeAnnotationsVisitor(context).transform_module(tree.with_changes(body=body))
    annotated = annotated.with_changes(
        body=[
            s.with_changes(body=hidden[s.name.value])
            if isinstance(s, cst.FunctionDef) and s.name.value in hidden
            else s
            for s in annotated.body
        ]
    )
    if shapes:
        annotated = annotated.visit(_ShapeDocs(shapes))
    text = annotated.code
    if "torch." in text and not re.search(r"^import torch$", text, re.M):
        text = text.replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nimport torch\n",
            1,
        )
    return _type_only_relative_imports(text, code)


def _type_only_relative_imports(text: str, before: str, extra: list[str] | None = None) -> str:
    """Relative imports the annotations added go under `if TYPE_CHECKING:` (no import cycles)."""
    added = [
        line
        for line in text.splitlines()
        if line.startswith("from .") and line not in before.splitlines()
    ]
    if extra:
        text_lines = text.splitlines()
        added += [line for line in extra if line not in text_lines and line not in added]
    if not added:
        return text
    for line in added:
        if line in text.splitlines():
            text = text.replace(line + "\n", "", 1)
    tree = cst.parse_module(text)
    last = max(
        (
            i
            for i, s in enumerate(tree.body)
            if m.matches(s, m.SimpleStatementLine([m.Import() | m.ImportFrom()]))
        ),
        default=-1,
    )
    block = cst.parse_module(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "".join(f"    {line}\n" for line in added)
    ).body
    body = [*tree.body[: last + 1], block[0], *tree.body[last + 1 :]]
    guarded = block[1].with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(last + 2, guarded)
    return tree.with_changes(body=body).code


def coverage(files: dict[str, str], package: str) -> Coverage:
    """Annotated parameters and returns over all functions and methods of the package."""
    found = Coverage()
    for path, code in files.items():
        if not path.startswith(f"{package}/") or not path.endswith(".py"):
            continue
        for fn in m.findall(cst.parse_module(code), m.FunctionDef()):
            assert isinstance(fn, cst.FunctionDef)
            params = [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]
            for param in params:
                if param.name.value in ("self", "cls"):
                    continue
                found.total += 1
                found.annotated += param.annotation is not None
            found.total += 1
            found.annotated += fn.returns is not None
    return found
