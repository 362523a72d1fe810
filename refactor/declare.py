"""
mypy's "Need type annotation" (`var-annotated`) answered with the annotation it asks for.

A notebook's `losses = []` in a function whose later `append`s mypy cannot type (the values are
`Any`, or appended in another scope) is mypy's most common error on real notebooks' packages:
about a fifth of the functions the rounds gave `@no_type_check` on four corpora of public
notebooks. The function's code is fine; mypy only asks for the variable's type, and its message
names it: `(hint: "losses: list[<type>] = ...")`. The variable gets that annotation with `Any`
for each `<type>` (what mypy itself falls back to after the error), so the function stays
checked and keeps its annotations: `losses: list[Any] = []`; in a tuple assignment
(`xs, ys = [], []`) a declaration line goes before the statement (`xs: list[Any]`).

Where mypy gives no hint, a value made by a generic class of `collections` (`defaultdict(list)`,
`deque(maxlen=3)`, `Counter()`) gets that class, spelled as the call spells it, over `Any`
(`counts: defaultdict[Any, Any] = defaultdict(list)`). Not a `DataLoader` over a list: mypy
rejects the list itself there (not a `Dataset`), and the function is decorated as before.

Only the builtin containers of mypy's hint (`list`, `dict`, `set`), only in a function's body
(at a module's or a class's top level an annotation runs on import, or turns a dataclass's class
attribute into a field), only where the statement starts its own line, and never for a name the
function declares `global` or `nonlocal` (an annotation there is a SyntaxError); every other
such error goes on to `rejected.plan_edits` as before. The edits are made on the text by the
positions Python's `ast` gives (UTF-8 bytes, the line breaks it counts); the output step formats
the module afterwards.
"""

from __future__ import annotations

import ast
import io
import re
from dataclasses import dataclass

from .cut import parsed, statements
from .rejected import Error
from .typeexpr import add_imports_text

HINT = re.compile(
    r'^Need type annotation for "(?P<name>\w+)" \(hint: "(?P=name): (?P<type>.+) = \.\.\."\)$'
)
NO_HINT = re.compile(r'^Need type annotation for "(?P<name>\w+)"$')
UNKNOWN = re.compile(r'^Cannot determine type of "(?P<name>\w+)"$')  # `has-type`
BEFORE_DEF = re.compile(r'^Name "(?P<name>\w+)" is used before definition$')  # `used-before-def`
CONTAINER = re.compile(r"^(list|dict|set)\[<type>(?:, <type>)?\]$")
GENERIC = {"defaultdict": 2, "OrderedDict": 2, "deque": 1, "Counter": 1}  # their type parameters


@dataclass(frozen=True)
class Declared:
    """The modules' code with the annotations in, what was annotated (`module.function: name:
    type`, for the report) and the errors left for `plan_edits`."""

    files: dict[str, str]
    declared: tuple[str, ...]
    rest: list[Error]


def declare(files: dict[str, str], package: str, errors: list[Error]) -> Declared:
    """Annotate the variables of `errors`' `var-annotated` ones that carry a container hint."""
    wanted: dict[str, list[tuple[Error, str, str | None]]] = {}  # by module: (error, name, type)
    for error in errors:
        hint = HINT.match(error.text) if error.code == "var-annotated" else None
        bare = NO_HINT.match(error.text) if error.code == "var-annotated" else None
        if hint is not None and CONTAINER.match(hint["type"]):
            type_ = hint["type"].replace("<type>", "Any")
            wanted.setdefault(error.module, []).append((error, hint["name"], type_))
        elif bare is not None:  # the type from the value's class, if it is one of `GENERIC`
            wanted.setdefault(error.module, []).append((error, bare["name"], None))
        elif error.code == "has-type" and (unknown := UNKNOWN.match(error.text)):
            wanted.setdefault(error.module, []).append((error, unknown["name"], "Any"))
    out = dict(files)
    declared: list[str] = []
    answered: set[int] = set()  # the errors' ids
    settled: list[tuple[str, int, int]] = []  # (module, first line, last line)
    for module, asked in wanted.items():
        path = f"{package}/{module}.py"
        code, done, moot = _annotate(files.get(path, ""), asked)
        settled += [(module, *span) for span in moot]
        if done:
            if not _imports_any(parsed(code)):
                code = add_imports_text(code, {"from typing import Any"}, guarded=False)
            out[path] = code
            declared += [f"{module}.{text}" for _, text in done]
            answered.update(id(error) for error, _ in done)
            # a `del name` declared: mypy's other error there ("used before definition") too
            deleted = {(e.line, m["name"]) for e, _ in done if (m := UNKNOWN.match(e.text))}
            answered.update(
                id(e)
                for e in errors
                if e.module == module
                and (m := BEFORE_DEF.match(e.text))
                and (e.line, m["name"]) in deleted
            )
    rest = [
        error
        for error in errors
        if id(error) not in answered
        and not any(
            error.module == module and first <= error.line <= last
            for module, first, last in settled
        )
    ]  # in mypy's order
    return Declared(out, tuple(declared), rest)


def _annotate(
    code: str, asked: list[tuple[Error, str, str | None]]
) -> tuple[str, list[tuple[Error, str]], list[tuple[int, int]]]:
    """`code` with the asked annotations in (by line), the errors answered (with what, as
    `function: name: type`) and the lines whose errors those answers settle for this round."""
    tree = parsed(code)
    if tree is None:
        return code, [], []
    lines = io.StringIO(code, newline="").readlines()  # the line breaks `ast` counts
    at = _assignments(tree)
    from_collections = {
        a.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "collections"
        for a in node.names
        if a.asname in (None, a.name)
    }
    inline: dict[int, tuple[int, int, str]] = {}  # line: (start, end, new text), UTF-8 bytes
    before: dict[int, list[str]] = {}  # line: declarations to put above it
    done: list[tuple[Error, str]] = []
    # where mypy's fallback type for a variable now declared `Any` (`list[Any]`) made errors
    # this round: the function's lines from the declaration on (checked again next round)
    moot: list[tuple[int, int]] = []
    seen: set[tuple[int, str]] = set()
    for error, name, type_ in asked:
        found = at.get(error.line)
        if found is None or not 0 < error.line <= len(lines) or (error.line, name) in seen:
            continue
        seen.add((error.line, name))
        node, function, qualname = found
        line = lines[error.line - 1]
        indent = line[: len(line) - len(line.lstrip())]
        if isinstance(node, ast.Delete) or error.code == "has-type":
            if (
                isinstance(node, ast.Delete)
                and _deleted_local(node, function, name)
                and node.col_offset == len(indent.encode())
            ):
                ending = line[len(line.rstrip("\r\n")) :] or "\n"
                before.setdefault(error.line, []).append(f"{indent}{name}: Any{ending}")
                done.append((error, f"{qualname}: {name}: Any"))
            continue
        type_ = type_ if type_ is not None else _generic(node.value, from_collections)
        if (
            type_ is None
            or node.col_offset != len(indent.encode())  # after `;` or `if x:` on the line
            or name in _declared(function)
        ):
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and _rebound(function, name, node, type_):
            # `predictions = []`, later `predictions = probs.numpy()`: a list type fails there
            # (and mypy's own fallback, this round: its errors there go with the answer)
            moot.append((error.line, function.end_lineno or error.line))
            type_ = "Any"
        if (
            len(node.targets) == 1
            and (_binds(target, name, alone=True) or _attribute(target, name))
            and target.end_lineno == node.lineno
            and error.line not in inline
        ):  # `x = []`, `self.x = []`: annotated in place
            start, end = target.col_offset, target.end_col_offset or 0
            spelled = line.encode()[start:end].decode()
            inline[error.line] = (start, end, f"{spelled}: {type_}")
        elif any(_binds(t, name) for t in node.targets):  # `xs, ys = [], []`: the line before
            ending = line[len(line.rstrip("\r\n")) :] or "\n"
            before.setdefault(error.line, []).append(f"{indent}{name}: {type_}{ending}")
        else:
            continue
        done.append((error, f"{qualname}: {name}: {type_}"))
    for number in sorted({*inline, *before}, reverse=True):
        line = lines[number - 1]
        if number in inline:
            start, end, text = inline[number]
            raw = line.encode()
            line = (raw[:start] + text.encode() + raw[end:]).decode()
        lines[number - 1 : number] = [*before.get(number, []), line]
    return "".join(lines), done, moot


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _assignments(tree: ast.Module) -> dict[int, tuple[ast.Assign | ast.Delete, Function, str]]:
    """The assignments (and `del` statements) inside functions' bodies by first line, with
    their innermost function and its qualname. Not those of a module or a class body: there an
    annotation runs when the module is imported (these modules may not have `from __future__
    import annotations`) or makes a dataclass's, NamedTuple's or pydantic model's class
    attribute a field."""
    found: dict[int, tuple[ast.Assign | ast.Delete, Function, str]] = {}

    def visit(body: list[ast.stmt], function: Function | None, qualname: str) -> None:
        for node in body:
            inner = f"{qualname}.{getattr(node, 'name', '')}" if qualname else ""
            if isinstance(node, ast.ClassDef):
                visit(node.body, None, inner or node.name)
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, node, inner or node.name)
                continue
            if isinstance(node, ast.Assign | ast.Delete) and function is not None:
                found.setdefault(node.lineno, (node, function, qualname))
            for field in ("body", "orelse", "finalbody"):
                inner_body = getattr(node, field, None)
                if isinstance(inner_body, list):
                    visit(inner_body, function, qualname)
            for part in [*getattr(node, "handlers", ()), *getattr(node, "cases", ())]:
                visit(part.body, function, qualname)

    visit(tree.body, None, "")
    return found


_SAME = {
    "list": (ast.List, ast.ListComp), "dict": (ast.Dict, ast.DictComp),
    "set": (ast.Set, ast.SetComp),
}  # fmt: skip


def _rebound(function: Function, name: str, first: ast.Assign, type_: str) -> bool:
    """Whether another assignment of `function`'s own body binds `name` itself again, to
    something other than a new container of `type_`'s kind (`losses = []` each epoch)."""
    kind = type_.partition("[")[0]
    for node in statements(function.body, scopes=False):
        if node is first or not isinstance(node, ast.Assign):
            continue
        if not any(_binds(t, name) for t in node.targets):
            continue
        value = node.value
        same = isinstance(value, _SAME.get(kind, ())) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == kind
        )
        if not same:
            return True
    return False


def _deleted_local(node: ast.Delete, function: Function, name: str) -> bool:
    """Whether `node` is a `del name` of a local of `function` (a notebook's
    `try: del net / except NameError:` before it builds a new `net`: in the function the name
    is a new local, the `del` raises `UnboundLocalError`, a `NameError`, as in a fresh kernel).
    mypy cannot type the name there ("Cannot determine type"); a declaration `name: Any` just
    before the `del` binds nothing at run time and keeps the function checked."""
    if name in _declared(function):
        return False
    if not any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
        return False
    params = function.args
    every = [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg]
    return all(a is None or a.arg != name for a in every)


def _declared(function: Function) -> set[str]:
    """The names `function` declares `global` or `nonlocal` (an annotation of one of them is a
    SyntaxError), in its own body or a nested one."""
    names: set[str] = set()
    for node in statements(function.body):
        if isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
    return names


def _imports_any(tree: ast.Module | None) -> bool:
    """Whether the module binds `Any` by a top-level `from typing import Any` (or `*`)."""
    return tree is not None and any(
        isinstance(node, ast.ImportFrom)
        and node.module == "typing"
        and any(a.name in ("Any", "*") and a.asname is None for a in node.names)
        for node in tree.body
    )


def _generic(value: ast.expr, from_collections: set[str]) -> str | None:
    """`deque[Any]` for `deque(...)` (`collections.deque[Any]` for `collections.deque(...)`): a
    call of a class of `GENERIC` that the module imports from `collections`, over `Any`; None
    for anything else (a `Counter` of another library may take no type arguments)."""
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Name) and func.id in from_collections:
        name = func.id
    elif (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "collections"
    ):
        name = func.attr
    else:
        return None
    if name not in GENERIC:
        return None
    return f"{ast.unparse(func)}[{', '.join(['Any'] * GENERIC[name])}]"


def _attribute(target: ast.expr, name: str) -> bool:
    """Whether the target is `self.name` (an attribute `name` of a plain name)."""
    return (
        isinstance(target, ast.Attribute)
        and target.attr == name
        and isinstance(target.value, ast.Name)
    )


def _binds(target: ast.expr, name: str, alone: bool = False) -> bool:
    """Whether the assignment target binds `name` itself (not an attribute or an item of it);
    `alone`: as the whole target."""
    if isinstance(target, ast.Name):
        return target.id == name
    if alone:
        return False
    if isinstance(target, ast.Tuple | ast.List):
        return any(_binds(t, name) for t in target.elts)
    if isinstance(target, ast.Starred):
        return _binds(target.value, name)
    return False
