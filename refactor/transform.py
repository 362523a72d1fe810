"""
The libcst edits the emit step applies to notebook code (one transformer per concern):

- `DeviceTransformer`: `.cuda()` / `.cuda(N)` -> `.to(device)`, and a `"cuda"` / `"cuda:N"` literal
  given to `torch.device(...)`, `.to(...)` or a `device=` keyword -> `device` (a parameter, so the
  package runs on a CPU too).
- `GlobalsToParameters`: a function (or class `__init__`) gets keyword-only parameters for the
  notebook globals it reads, and its body reads the parameters.
- `CallSites`: every call of such a function or class passes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import libcst as cst

from .typeexpr import map_params

if TYPE_CHECKING:
    from .placement import Param

CUDA_TEXT = re.compile(r"^[rbu]*['\"]cuda(:\d+)?['\"]$")


class DeviceTransformer(cst.CSTTransformer):
    def __init__(self) -> None:
        super().__init__()
        self.changed = 0
        self._device_args = 0  # inside torch.device(...) / .to(...) / device=

    def _device_call(self, node: cst.Call) -> bool:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("device", "to"):
            return True
        return isinstance(func, cst.Name) and func.value == "device"

    def visit_Call(self, node: cst.Call) -> None:
        if self._device_call(node):
            self._device_args += 1

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self._device_call(original_node):
            self._device_args -= 1
        func = updated_node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
            self.changed += 1
            return updated_node.with_changes(
                func=func.with_changes(attr=cst.Name("to")), args=[cst.Arg(cst.Name("device"))]
            )
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "device"
            and len(updated_node.args) == 1
            and isinstance(updated_node.args[0].value, cst.Name)
            and updated_node.args[0].value.value == "device"
        ):
            return cst.Name("device")  # torch.device("cuda:2") became torch.device(device)
        return updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        keyword = original_node.keyword
        in_device_call = self._device_args > 0 and keyword is None
        is_device_kw = keyword is not None and keyword.value == "device"
        value = updated_node.value
        if (
            (in_device_call or is_device_kw)
            and isinstance(value, cst.SimpleString)
            and CUDA_TEXT.match(value.value)
        ):
            self.changed += 1
            return updated_node.with_changes(value=cst.Name("device"))
        return updated_node


class _Rename(cst.CSTTransformer):
    """Rename reads of globals (`LR` -> `lr`); attribute names and keywords are left alone."""

    def __init__(self, names: Mapping[str, str]) -> None:
        super().__init__()
        self.names = names

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # `x.LR` is not the global: only the value part is renamed (below)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        return updated_node.with_changes(value=original_node.value.visit(self))

    def visit_Arg(self, node: cst.Arg) -> bool:
        return True

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.names.get(original_node.value)
        return updated_node.with_changes(value=new) if new else updated_node


class _RenameLoads(_Rename):
    """Reads only: a name an assignment, a `for`, a `with ... as` or `:=` binds keeps its name
    (`model = model()` calls the function's version and binds the value under the plain name);
    the reads inside a target (`x[i] = ...`, `obj.attr = ...`) are renamed."""

    def _target(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> Any:
        if isinstance(original, cst.Name):
            return original
        if isinstance(original, cst.Tuple | cst.List) and isinstance(updated, type(original)):
            return updated.with_changes(
                elements=[
                    u.with_changes(value=self._target(o.value, u.value))
                    for o, u in zip(original.elements, updated.elements, strict=True)
                ]
            )
        return updated

    def leave_AssignTarget(
        self, original_node: cst.AssignTarget, updated_node: cst.AssignTarget
    ) -> cst.AssignTarget:
        return updated_node.with_changes(
            target=self._target(original_node.target, updated_node.target)
        )

    def leave_AnnAssign(
        self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign
    ) -> cst.AnnAssign:
        return updated_node.with_changes(
            target=self._target(original_node.target, updated_node.target)
        )

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return updated_node.with_changes(
            target=self._target(original_node.target, updated_node.target)
        )

    def leave_AsName(self, original_node: cst.AsName, updated_node: cst.AsName) -> cst.AsName:
        return updated_node.with_changes(name=self._target(original_node.name, updated_node.name))

    def leave_NamedExpr(
        self, original_node: cst.NamedExpr, updated_node: cst.NamedExpr
    ) -> cst.NamedExpr:
        return updated_node.with_changes(
            target=self._target(original_node.target, updated_node.target)
        )


def rename_loads(node: cst.BaseStatement, names: Mapping[str, str]) -> cst.BaseStatement:
    """`node` with the reads of the variables in `names` renamed; what it binds keeps its name."""
    return node.visit(_RenameLoads(names))  # type: ignore[return-value]


def aliased_import(node: cst.BaseStatement, name: str, alias: str) -> cst.BaseStatement | None:
    """An import statement with what it binds as `name` bound as `alias` instead (`from tqdm
    import tqdm as tqdm_v1`); None where it binds no `name` (`import a.b` binds `a`, and no
    alias of `a.b` binds the same), or is no import of names."""
    if not isinstance(node, cst.SimpleStatementLine):
        return None
    line = node.body[0]
    if not isinstance(line, cst.Import | cst.ImportFrom) or isinstance(line.names, cst.ImportStar):
        return None
    for index, one in enumerate(line.names):
        if (one.evaluated_alias or one.evaluated_name) == name:
            names = list(line.names)
            names[index] = one.with_changes(asname=cst.AsName(name=cst.Name(alias)))
            return node.with_changes(body=[line.with_changes(names=names), *node.body[1:]])
    return None


def rename_in(node: cst.CSTNode, names: Mapping[str, str]) -> Any:
    """Any node (a base class, a decorator, a parameter list) with `names` renamed."""
    return node.visit(_Rename(names))


def rename_reads(node: cst.BaseStatement, names: Mapping[str, str]) -> cst.BaseStatement:
    """`node` with the variables in `names` renamed (not attribute names nor keywords)."""
    return node.visit(_Rename(names))  # type: ignore[return-value]


def _with_params(fn: cst.FunctionDef, params: list[Param]) -> cst.FunctionDef:
    existing = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
    added = [
        cst.Param(
            name=cst.Name(p.name),
            default=cst.Name(p.default) if p.default is not None else None,
        )
        for p in params
        if p.name not in existing
    ]
    if not added:
        return fn
    renames = {p.source: p.name for p in params if p.source != p.name}
    body = fn.body.visit(_Rename(renames)) if renames else fn.body
    star = fn.params.star_arg
    if not isinstance(star, cst.Param):
        star = cst.ParamStar()
    required = [p for p in added if p.default is None]
    optional = [p for p in added if p.default is not None]
    kwonly = [*required, *fn.params.kwonly_params, *optional]
    if any(p.default is not None for p in fn.params.kwonly_params):
        kwonly = [*fn.params.kwonly_params, *added]  # keyword-only order does not matter
    return fn.with_changes(
        params=fn.params.with_changes(star_arg=star, kwonly_params=kwonly),
        body=body,
    )


def add_parameters(node: cst.BaseStatement, params: list[Param]) -> cst.BaseStatement:
    if not params:
        return node
    if isinstance(node, cst.FunctionDef):
        return _with_params(node, params)
    if isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock):
        body = [
            _with_params(s, params)
            if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
            else s
            for s in node.body.body
        ]
        return node.with_changes(body=node.body.with_changes(body=body))
    return node


class CallSites(cst.CSTTransformer):
    """`train_epoch(model, loader)` -> `train_epoch(model, loader, device=device, lr=LR)`.

    `callee_params`: the parameters each function or class gained; `local`: how the caller
    names each notebook global it receives (its own parameter names).
    """

    def __init__(
        self, callee_params: Mapping[str, list[Param]], local: Mapping[str, str], in_run: bool
    ) -> None:
        super().__init__()
        self.callee_params = callee_params
        self.local = local
        self.in_run = in_run  # run() binds every constant as a local

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = updated_node.func
        if not isinstance(func, cst.Name) or func.value not in self.callee_params:
            return updated_node
        # A `*args` fills no keyword-only parameter, and a `**kwargs` hardly ever one of these:
        # what the callee gained are globals it read, not parameters the notebook's call could
        # name (only a callee with a `**kw` of its own, called with that global's name among
        # the keys, now gets it twice; the old way dropped it at every such call)
        passed = {a.keyword.value for a in updated_node.args if a.keyword is not None}
        args = list(updated_node.args)
        for param in self.callee_params[func.value]:
            if param.name in passed:
                continue
            if param.default is not None and not self.in_run and param.source not in self.local:
                continue  # a constant this caller does not receive: the default is its value
            value = self.local.get(param.source, param.source)
            args.append(
                cst.Arg(
                    keyword=cst.Name(param.name),
                    value=cst.Name(value),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""),
                    ),
                )
            )
        if args and len(args) != len(updated_node.args):
            fixed = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
            return updated_node.with_changes(args=fixed)
        return updated_node


def rename_heads(node: cst.BaseStatement, names: Mapping[str, str]) -> cst.BaseStatement:
    """A def's or a class's parts that run when it is defined (what `analyze` calls
    `at_definition`: decorators, defaults, parameter annotations and the return's; a class's
    bases and keywords, and its methods' decorators and defaults) with `names` renamed, the rest
    (the body, which runs later) unchanged."""
    if isinstance(node, cst.FunctionDef):

        def head(p: cst.Param) -> cst.Param:
            return p.with_changes(
                default=rename_in(p.default, names) if p.default is not None else None,
                annotation=rename_in(p.annotation, names) if p.annotation is not None else None,
            )

        return node.with_changes(
            decorators=[rename_in(d, names) for d in node.decorators],
            params=map_params(node.params, head),
            returns=rename_in(node.returns, names) if node.returns is not None else None,
        )
    if not isinstance(node, cst.ClassDef):
        return node
    body = node.body
    if isinstance(body, cst.IndentedBlock):

        def method(s: cst.BaseStatement) -> cst.BaseStatement:
            if not isinstance(s, cst.FunctionDef):
                return s

            def default(p: cst.Param) -> cst.Param:
                return p.with_changes(default=rename_in(p.default, names)) if p.default else p

            return s.with_changes(
                decorators=[rename_in(d, names) for d in s.decorators],
                params=map_params(s.params, default),
            )

        body = body.with_changes(body=[method(s) for s in body.body])
    return node.with_changes(
        decorators=[rename_in(d, names) for d in node.decorators],
        bases=[rename_in(b, names) for b in node.bases],
        keywords=[rename_in(k, names) for k in node.keywords],
        body=body,
    )
