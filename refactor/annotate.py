"""
Step 5: type annotations for every function of the written package, then mypy on them.

The types come from static inference through the package's dataflow (`infer`: constructors, call
sites, returns, known library calls) and, with `--execute`, from the types recorded while the
notebook ran (`traced`), which come first. Only parameters and returns that have no annotation
get one; the imports the annotations need go under `if TYPE_CHECKING:` (no import cycles, nothing
run on import). `typecheck` then runs mypy once on the package: an annotation it rejects is
removed, and a function whose own code fails gets `@no_type_check` (the report says why).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from .cut import edit_headers, parsed, statements
from .infer import infer
from .symbols import Package, index
from .traced import recorded
from .typecheck import Checked, check
from .typeexpr import NONE, ByQualname, Renderer, Ty, add_imports, add_imports_text, map_params


@dataclass(frozen=True)
class Coverage:
    annotated: int = 0
    total: int = 0

    @property
    def share(self) -> float:
        return self.annotated / self.total if self.total else 1.0


@dataclass(frozen=True)
class Signature:
    params: dict[str, Ty] = field(default_factory=dict)
    returns: Ty | None = None


@dataclass(frozen=True)
class Annotated:
    files: dict[str, str]
    coverage: Coverage
    checked: Checked


def signatures(pkg: Package, trace: Any = None, globals_seen: Any = None) -> dict[str, Signature]:
    """What to write, by function key: traced types first, then the static ones."""
    rec = recorded(pkg, trace, globals_seen)
    static = infer(pkg, rec.globals)
    found: dict[str, Signature] = {}
    for key, fn in pkg.functions.items():
        names = {a.arg for a in fn.params if a.annotation is None}
        params = {**static.params.get(key, {}), **rec.params.get(key, {})}
        returns = rec.returns.get(key) or static.returns.get(key)
        if fn.qualname.endswith(".__init__"):
            returns = NONE
        sig = Signature(
            {n: t for n, t in params.items() if n in names},
            returns if fn.node.returns is None else None,
        )
        if sig.params or sig.returns is not None:
            found[key] = sig
    return found


class SetAnnotations(ByQualname):
    """Write the signatures' types into parameters and returns that have none."""

    def __init__(self, sigs: dict[str, Signature], render: Callable[[Ty], str]) -> None:
        super().__init__()
        self.sigs = sigs
        self.render = render

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # nested functions keep their own (no) annotations

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        sig = self.sigs.get(self.qualname(updated_node))
        if sig is None:
            return updated_node

        def typed(param: cst.Param) -> cst.Param:
            kind = sig.params.get(param.name.value)
            if kind is None or param.annotation is not None:
                return param
            return param.with_changes(annotation=_annotation(self.render(kind)))

        params = map_params(updated_node.params, typed)
        returns = updated_node.returns
        if returns is None and sig.returns is not None:
            returns = _annotation(self.render(sig.returns))
        return updated_node.with_changes(params=params, returns=returns)


@functools.lru_cache(maxsize=1024)
def _annotation(text: str) -> cst.Annotation:
    return cst.Annotation(cst.parse_expression(text))  # the same few types, over and over


class ShapeDocs(ByQualname):
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
            and len(first.body) == 1
            and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, cst.SimpleString)
        ):
            old = first.body[0].value
            quote = old.value[-3:] if old.value.endswith(('"""', "'''")) else None
            if quote is None:
                return updated_node
            new = cst.SimpleString(f"{old.value[:-3].rstrip()}\n\n{text}\n{quote}")
            statement = first.with_changes(body=[first.body[0].with_changes(value=new)])
            return updated_node.with_changes(
                body=body.with_changes(body=[statement, *body.body[1:]])
            )
        doc = cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{text}\n"""'))])
        return updated_node.with_changes(body=body.with_changes(body=[doc, *body.body]))


def apply(
    files: dict[str, str],
    package: str,
    pkg: Package,
    sigs: dict[str, Signature],
    shapes: Any,
    traced: bool = False,
) -> dict[str, str]:
    out = dict(files)
    for name, module in pkg.modules.items():
        prefix = f".{name}."
        mine = {k.removeprefix(prefix): s for k, s in sigs.items() if k.startswith(prefix)}
        docs = {k.removeprefix(prefix): s for k, s in shapes.items() if k.startswith(prefix)}
        if not mine and not docs:
            continue
        path = f"{package}/{name}.py"
        taken = {
            n.id if isinstance(n, ast.Name) else n.arg
            for n in ast.walk(module.tree)
            if isinstance(n, ast.Name | ast.arg)
        }
        render = Renderer(
            name, dict(module.bound), set(), frozenset(taken - set(module.bound)), short=traced
        )
        flag = "TYPE_CHECKING" in module.bound
        if docs:
            tree = cst.parse_module(files[path]).visit(SetAnnotations(mine, render))
            tree = tree.visit(ShapeDocs(docs))
            out[path] = add_imports(tree, render.imports, have_flag=flag).code
            continue
        # the signatures alone go through libcst: the bodies are neither parsed nor written
        code = edit_headers(files[path], set(mine), functools.partial(SetAnnotations, mine, render))
        out[path] = add_imports_text(code, render.imports, have_flag=flag)
    return out


def annotate(
    files: dict[str, str],
    package: str,
    trace: dict[str, list[dict[str, Any]]] | None = None,
    globals_seen: dict[str, Any] | None = None,
    typecheck: bool = True,
) -> Annotated:
    """The package's files with types written in (and checked by mypy when it is installed)."""
    pkg = index(files, package)
    sigs = signatures(pkg, trace, globals_seen)
    shapes = recorded(pkg, trace).shapes if trace else {}
    written = apply(files, package, pkg, sigs, shapes, traced=bool(trace))

    def write(now: dict[str, str], more: dict[str, Any]) -> dict[str, str]:
        more = {k: Signature(dict(s.params), s.returns) for k, s in more.items()}
        return apply(now, package, index(now, package), more, {}, traced=bool(trace))

    checked = (
        check(written, package, sigs, write)
        if typecheck
        else Checked(written, "not run (--no-typecheck): the inferred annotations are not checked")
    )
    return Annotated(checked.files, coverage(checked.files, package), checked)


def coverage(files: dict[str, str], package: str) -> Coverage:
    """Annotated parameters and returns over all functions and methods of the package."""
    annotated = total = 0
    for path, code in files.items():
        if not path.startswith(f"{package}/") or not path.endswith(".py"):
            continue
        tree = parsed(code)
        if tree is None:
            continue  # an earlier step's problem, reported by the ruff gate
        for fn in statements(tree.body):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = fn.args
            params = [
                p for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")
            ]
            total += len(params) + 1
            annotated += sum(p.annotation is not None for p in params) + (fn.returns is not None)
    return Coverage(annotated, total)
