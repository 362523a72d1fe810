"""
What mypy's errors on the annotated package ask for: the annotations of ours to remove, and the
functions whose own code fails to decorate with `@no_type_check` (`plan_edits`); and which errors
count (`checked_by_default`: mypy reports those of a function without annotations only because
the rounds that read its types check such functions too).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .cut import parsed, statements

# errors about a name or attribute (a variable's missing annotation, an attribute whose defining
# function mypy does not check, an undefined name): no parameter's annotation causes them, but
# for an attribute read from a parameter (`sbs.total_epochs`), where the parameter's type counts
NOT_A_PARAMETER = frozenset({"var-annotated", "has-type", "name-defined"})
CALL_CODES = frozenset({"arg-type", "call-arg", "misc"})  # errors of a call's arguments
# the function such an error is about: 'Too many arguments for "train"', 'Argument 3 to "train"
# has ...', '"train" gets multiple values for keyword argument "loss"'
CALLEE = re.compile(r'^"(\w+)" gets multiple values|(?:for|to) "(\w+)"')
HAS_TYPE = re.compile(r'^Cannot determine type of "(\w+)"')
ARGUMENT = re.compile(
    r'^Argument (?:(?P<n>\d+)|"(?P<name>\w+)") to "(?P<fn>\w+)"(?: of "(?P<cls>\w+)")?'
)


@dataclass(frozen=True)
class Error:
    """One of mypy's errors: where (module, line), what, and its code."""

    module: str
    line: int
    text: str
    code: str


Function = tuple[str, int, int, ast.FunctionDef | ast.AsyncFunctionDef]


def functions_of(code: str) -> list[Function]:
    """(qualname, first line, last line, node) of the module's functions and methods."""
    found = []
    tree = parsed(code)
    if tree is None:
        return []
    for node in tree.body:
        members = [(node, "")] if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else []
        if isinstance(node, ast.ClassDef):
            members = [
                (s, f"{node.name}.")
                for s in node.body
                if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
        for fn, prefix in members:
            first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
            found.append((prefix + fn.name, first, fn.end_lineno or fn.lineno, fn))
    return found


def checked_by_default(errors: list[Error], files: dict[str, str], package: str) -> list[Error]:
    """`errors` less those in a function with no annotation or with `@no_type_check` (the
    innermost around the line), which mypy checks only with `check_untyped_defs`."""
    untyped: dict[str, list[tuple[int, int, bool]]] = {}
    kept = []
    for error in errors:
        if error.module not in untyped:
            tree = parsed(files.get(f"{package}/{error.module}.py", ""))
            untyped[error.module] = [
                (
                    min([fn.lineno, *(d.lineno for d in fn.decorator_list)]),
                    fn.end_lineno or fn.lineno,
                    not annotated_names(fn)
                    or any(_name(d) == "no_type_check" for d in fn.decorator_list),
                )
                for fn in statements(tree.body if tree is not None else [])
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
        around = [r for r in untyped[error.module] if r[0] <= error.line <= r[1]]
        innermost = min(around, key=lambda r: r[1] - r[0], default=None)
        if innermost is None or not innermost[2]:
            kept.append(error)
    return kept


def _name(node: ast.expr) -> str | None:
    """`no_type_check` for `@no_type_check` and `@typing.no_type_check`."""
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def plan_edits(
    files: dict[str, str],
    package: str,
    errors: list[Error],
    added: Mapping[str, object],
    decorated: dict[str, str],
    removed: list[str],
    untyped: list[str],
) -> dict[str, tuple[dict[str, set[str]], set[str]]]:
    """For each module: annotations to drop (by function) and functions to decorate (and, in
    `untyped`, the methods left without annotations instead)."""
    edits: dict[str, tuple[dict[str, set[str]], set[str]]] = {}
    ours = {key: getattr(sig, "params", {}) for key, sig in added.items()}
    returns = {key for key, sig in added.items() if getattr(sig, "returns", None) is not None}
    by_name: dict[str, list[str]] = {}
    for key in ours:
        by_name.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    parsed: dict[str, tuple[list[Function], list[str]]] = {}  # each module parsed once a round
    for error in errors:
        if error.module not in parsed:
            code = files.get(f"{package}/{error.module}.py", "")
            parsed[error.module] = (functions_of(code), code.splitlines())
        functions, lines = parsed[error.module]
        where = next(((q, fn) for q, a, b, fn in functions if a <= error.line <= b), None)
        line = lines[error.line - 1] if 0 < error.line <= len(lines) else ""
        dropped = False
        argument = ARGUMENT.match(error.text)
        about = CALLEE.search(error.text) if error.code in CALL_CODES else None
        callee = (about[1] or about[2]) if about is not None else None
        unpacked = where is not None and callee is not None and _unpacks(where[1], error, callee)
        if argument and error.code == "arg-type" and not unpacked:
            for key in by_name.get(argument["fn"], []):
                if argument["cls"] and not key.endswith(f"{argument['cls']}.{argument['fn']}"):
                    continue
                dropped |= _drop(edits, key, set(ours[key]), removed)
        if where is None or dropped:
            continue
        qualname, fn = where
        key = f".{error.module}.{qualname}"
        if key[1:] in untyped:
            continue  # mypy does not check it any more
        mine = set(ours.get(key, {}))
        if unpacked:
            # the call it names unpacks a sequence (`train(net, *data, epochs)`): once mypy does
            # not know the sequence's length (an annotation of ours dropped, Dive into DL 3.16)
            # it maps the later arguments onto parameters by guesswork ("Too many arguments", an
            # argument checked against the wrong parameter), and dropping the callee's
            # annotations only hides that; the call is this function's own code, which is
            # decorated (or left unannotated, below)
            pass
        elif error.code in ("return-value", "return") and key in returns:
            dropped = _drop(edits, key, {"return"}, removed)
        elif error.line == fn.lineno or error.line <= (fn.body[0].lineno - 1):
            dropped = _drop(edits, key, mine | ({"return"} if key in returns else set()), removed)
        else:
            named = {p for p in mine if re.search(rf"\b{re.escape(p)}\b", line)}
            kept = {
                n
                for n in annotated_names(fn) - named
                if f"{error.module}.{qualname}({n})" not in removed
            }
            if error.code in NOT_A_PARAMETER and kept and not _read_from(named, error, line):
                # a parameter's type is not what these errors are about: dropping the ones named
                # on the line only ends them by leaving mypy a function without annotations
                # (which it does not check); else the next round shows the same error and the
                # function is decorated then, one round later and with annotations lost
                named = set()
            dropped = _drop(edits, key, named, removed)
        every = annotated_names(fn)
        if (
            not dropped
            and "." in qualname
            and every
            and every <= mine | ({"return"} if key in returns else set())
            and _sets_attributes(fn)
        ):
            # a method that sets attributes on `self`, all of whose annotations are ours:
            # decorated, it would leave those attributes without a type for every other method
            # that reads them (mypy's "Cannot determine type", one round later, and each of those
            # decorated in turn); without annotations mypy does not check it, its attributes are
            # Any, and the other methods keep being checked
            dropped = _drop(edits, key, every, removed)
            untyped.append(key[1:])
        if not dropped and f"{error.module}.{qualname}" not in decorated:
            decorated[f"{error.module}.{qualname}"] = f"{error.text} (line {error.line})"
            edits.setdefault(error.module, ({}, set()))[1].add(qualname)
    return edits


def _read_from(params: set[str], error: Error, line: str) -> bool:
    """Whether `error` is mypy's "Cannot determine type" of an attribute `line` reads from one of
    `params` (`sbs.total_epochs`): mypy looks it up in the parameter's annotated type, and
    without the annotation (Any) the error ends."""
    name = HAS_TYPE.match(error.text) if error.code == "has-type" else None
    return name is not None and any(
        re.search(rf"\b{re.escape(p)}\s*\.\s*{re.escape(name[1])}\b", line) for p in params
    )


def _unpacks(fn: ast.FunctionDef | ast.AsyncFunctionDef, error: Error, callee: str) -> bool:
    """Whether the call of `callee` that `error` is about (on its line in `fn`) unpacks a
    sequence into its arguments (`*args`)."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        if not node.lineno <= error.line <= (node.end_lineno or node.lineno):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name == callee and any(isinstance(a, ast.Starred) for a in node.args):
            return True
    return False


def _sets_attributes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the method assigns an attribute of its first parameter (`self.items = ...`)."""
    args = [*fn.args.posonlyargs, *fn.args.args]
    if not args:
        return False
    first = args[0].arg
    for node in ast.walk(fn):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == first
                    and isinstance(part.ctx, ast.Store)
                ):
                    return True
    return False


def annotated_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names of `fn`'s annotated parameters, and "return" if its return is annotated."""
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {p.arg for p in params if p is not None and p.annotation is not None}
    return names | ({"return"} if fn.returns is not None else set())


def _drop(
    edits: dict[str, tuple[dict[str, set[str]], set[str]]],
    key: str,
    names: set[str],
    removed: list[str],
) -> bool:
    """Drop our annotations `names` of function `key` (`.mod.fn`); False if none was left."""
    module, _, qualname = key[1:].partition(".")
    new = {n for n in names if f"{module}.{qualname}({n})" not in removed}
    if not new:
        return False
    edits.setdefault(module, ({}, set()))[0].setdefault(qualname, set()).update(new)
    removed += [f"{module}.{qualname}({n})" for n in sorted(new)]
    return True


def fresh_first(
    errors: list[Error],
    files: dict[str, str],
    package: str,
    fresh: Mapping[str, set[str]],
    removed: list[str],
) -> tuple[dict[str, tuple[dict[str, set[str]], set[str]]], list[Error]]:
    """Edits for the errors inside a function that had none before mypy's last reading gave it
    annotations (`fresh`, by key): those annotations go, since they made it fail (a parameter
    typed now makes mypy check a body it skipped, `self.buffer` of unknown type), not the
    function's checking; and the other errors, for `plan_edits`."""
    edits: dict[str, tuple[dict[str, set[str]], set[str]]] = {}
    rest: list[Error] = []
    parsed: dict[str, list[Function]] = {}
    for error in errors:
        if error.module not in parsed:
            parsed[error.module] = functions_of(files.get(f"{package}/{error.module}.py", ""))
        where = next((q for q, a, b, _ in parsed[error.module] if a <= error.line <= b), None)
        key = f".{error.module}.{where}"
        if where is None or key not in fresh:
            rest.append(error)
        else:
            _drop(edits, key, fresh[key], removed)
    return edits, rest
