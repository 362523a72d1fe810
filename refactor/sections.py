"""
Step 4a: the notebook's script becomes functions by section.

The top-level code that is kept (`compose.py` says which) is cut where the notebook's markdown
headings are (cells under one heading are one section; cells with no heading above them are one
section each) into functions named from the heading (`## Load the data` -> `load_data`). The
dataflow between them comes from the names each statement reads and binds (libcst's scope
analysis, `analyze.py`): a section's parameters are what it reads that an earlier section bound,
its returns what a later section reads (and the results it leaves that nothing rebinds, so
`run()` ends with the notebook's state). A constant comes from `config`; module state
(`plan.module_state`) is declared `global` where it is bound, neither passed nor returned. A
section whose every statement only displays (plots, prints, `display()`) is display-only: `run()`
calls it only when `config.plots` is set.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from .analyze import BUILTINS
from .definite import definitely_bound
from .walk import children, find, isa

STOP_WORDS = frozenset({"a", "an", "the", "of", "to", "for", "with", "our", "on", "in"})
NUMBERING = re.compile(r"^\s*(step|part|section|chapter)?\s*[\d.ivx]*\s*[:.)-]?\s+", re.I)
VERBS = {  # a one-word heading names what the section does
    "data": "load_data",
    "dataset": "load_data",
    "datasets": "load_data",
    "loading": "load_data",
    "preprocessing": "preprocess",
    "model": "build_model",
    "models": "build_model",
    "architecture": "build_model",
    "training": "train",
    "train": "train",
    "evaluation": "evaluate",
    "testing": "evaluate",
    "inference": "predict",
    "prediction": "predict",
    "predictions": "predict",
    "results": "show_results",
    "visualization": "plot",
    "plots": "plot",
    "plotting": "plot",
    "saving": "save_model",
    "setup": "set_up",
    "configuration": "set_up",
    "config": "set_up",
    "imports": "set_up",
}


@dataclass(frozen=True)
class Unit:
    """One kept top-level statement (or a whole `%%train` cell) of the script, as code."""

    cell: int
    heading: str | None
    markdown: str | None
    code: str  # its code in the section function (already transformed)
    reads: tuple[str, ...]  # names it reads, including what the functions it calls receive
    binds: tuple[str, ...]
    results: tuple[str, ...]  # what it binds that the notebook ends with as a result
    display: bool
    built: tuple[str, ...] = ()  # `ds = Dataset(...)`: a result only if nothing after uses it
    trains: bool = False  # a `%%train` cell or a loop calling backward(): what it reads is trained
    deletes: tuple[str, ...] = ()  # `del df` at the top level (not in a def): unbound after it


@dataclass(frozen=True)
class Section:
    name: str
    heading: str | None
    cells: tuple[int, ...]
    units: tuple[Unit, ...]
    params: tuple[str, ...]  # what it reads that an earlier section (or run()) bound
    returns: tuple[str, ...]  # what later sections read, and its results
    config: tuple[str, ...]  # constants it takes from `config`
    declares: tuple[str, ...]  # module state it binds (`global`)
    display: bool
    # what it returns, a later section reads and it binds on some paths only, nothing earlier
    # binding it: None first (`definite`), as absent at the notebook's top level
    unbound: tuple[str, ...] = ()


def function_name(heading: str | None, cell: int, taken: set[str]) -> str:
    """`## 2. Load the data!` -> `load_data`; unique, never a name already taken."""
    words: list[str] = []
    if heading:
        text = NUMBERING.sub("", re.sub(r"[`*_\[\]()]", " ", heading))
        words = [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOP_WORDS]
    name = "_".join(words[: 8 if words[:1] == ["make"] else 4]) or f"cell_{cell}"
    if words and words[0] in VERBS and (len(words) == 1 or name in taken):
        name = VERBS[words[0]] if len(words) == 1 else f"{VERBS[words[0]]}_{'_'.join(words[1:4])}"
    if name in taken and not name.startswith("cell_"):
        name = f"{name}_section"
    if name[0].isdigit():
        name = "section_" + name
    if keyword.iskeyword(name) or name in BUILTINS:
        name += "_section"
    candidate, number = name, 2
    while candidate in taken:
        candidate = f"{name}_{number}"
        number += 1
    taken.add(candidate)
    return candidate


def cut(
    units: Iterable[Unit],
    constants: set[str],
    module_state: set[str],
    run_binds: set[str],
    taken: set[str],
) -> tuple[Section, ...]:
    """Group `units` by heading and work out each section's parameters and returns.

    `run_binds`: names `run()` binds before the first section (the device).
    """
    groups: list[list[Unit]] = []
    for unit in units:
        last = groups[-1][-1] if groups else None
        same = last is not None and (
            (unit.heading is not None and unit.heading == last.heading) or last.cell == unit.cell
        )
        if same:
            groups[-1].append(unit)
        else:
            groups.append([unit])
    owner: dict[str, int | str] = {}
    owner.update(dict.fromkeys(constants, "config"))
    owner.update(dict.fromkeys(run_binds, "run"))
    params: list[list[str]] = []
    configs: list[list[str]] = []
    returns: list[dict[str, None]] = [{} for _ in groups]
    read_later: list[set[str]] = [set() for _ in groups]  # returned because a later one reads it
    maybe: list[set[str]] = []  # bound on some paths only, and nowhere before
    for index, group in enumerate(groups):
        local: set[str] = set()
        certain: set[str] = set()  # bound on every path so far
        wanted: dict[str, None] = {}
        from_config: dict[str, None] = {}
        unsure: set[str] = set()
        flow = _Flow(owner, wanted, from_config, returns, read_later)
        for unit in group:
            for name in unit.reads:
                if name not in local and name not in module_state:
                    flow.take(name)
            definite = definitely_bound(unit.code)
            if definite is None:
                definite = frozenset(unit.binds)
            for name in unit.binds:
                # bound on some paths only (`if restart: opt = ...`): the other paths see the
                # value from before, which comes in; with none before, it may stay unbound
                fresh = name not in definite and name not in certain
                if fresh and name not in module_state and not flow.take(name):
                    unsure.add(name)
            local |= set(unit.binds)
            certain |= definite
        for name in local - module_state:
            owner[name] = index
        params.append(list(wanted))
        configs.append(list(from_config))
        maybe.append(unsure - certain)
    # the results a section leaves: bound, never rebound later, not only a loop variable
    for index, group in enumerate(groups):
        if all(u.display for u in group):
            continue
        for position, unit in enumerate(group):
            later = {n for u in group[position + 1 :] for n in u.reads}
            trained = {n for u in group[position:] if u.trains for n in u.reads}
            for name in unit.results:
                if name in unit.built and name in later and name not in trained:
                    continue  # an object built to be used, and used: not a result
                if _deleted_after(group, position, name):
                    continue  # `df = read(...)`, `del df`: gone when the section ends
                # (what a training loop reads, the model above all, is what the notebook made)
                if owner.get(name) == index and not name.startswith("_"):
                    returns[index].setdefault(name, None)
    unbound: list[tuple[str, ...]] = []
    for index in range(len(groups)):
        for name in maybe[index] & set(returns[index]):
            if name not in read_later[index]:
                del returns[index][name]  # only a result: not returned, as possibly unbound
        unbound.append(tuple(n for n in returns[index] if n in maybe[index]))
    out: list[Section] = []
    for index, group in enumerate(groups):
        binds = {n for u in group for n in u.binds}
        display = all(u.display for u in group) and not returns[index]
        first = group[0]
        out.append(
            Section(
                function_name(
                    first.heading or _lead(first.markdown) or _made(group, returns[index]),
                    first.cell,
                    taken,
                ),
                first.heading,
                tuple(dict.fromkeys(u.cell for u in group)),
                tuple(group),
                tuple(params[index]),
                tuple(n for n in returns[index] if n not in module_state),
                tuple(configs[index]),
                tuple(sorted(binds & module_state)),
                display,
                unbound[index],
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class _Flow:
    """Where a section's names come from, as `cut` fills its tables for one section."""

    owner: dict[str, int | str]
    wanted: dict[str, None]
    from_config: dict[str, None]
    returns: list[dict[str, None]]
    read_later: list[set[str]]

    def take(self, name: str) -> bool:
        """`name` comes in (from `config`, `run()` or an earlier section), if anything binds it
        before: whether something does."""
        source = self.owner.get(name)
        if source == "config":
            self.from_config.setdefault(name, None)
        elif source is not None:
            self.wanted.setdefault(name, None)
            if isinstance(source, int):
                self.returns[source].setdefault(name, None)
                self.read_later[source].add(name)
        return source is not None


def _deleted_after(group: list[Unit], position: int, name: str) -> bool:
    """`name` is deleted at `position` or after and not bound again by a later statement."""
    last = max((i for i, u in enumerate(group) if i >= position and name in u.deletes), default=-1)
    return last >= 0 and not any(name in u.binds for u in group[last + 1 :])


_DELETE = (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Del)
_DEPTH = (
    cst.FunctionDef, cst.ClassDef, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For,
    cst.While,
)  # fmt: skip


def deleted(node: cst.BaseStatement) -> tuple[str, ...]:
    """The names a top-level statement deletes with `del name` (not inside a def or class)."""
    found: dict[str, None] = {}
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if not isa(current, _DELETE):
            stack.extend(children(current))
            continue
        if isinstance(current, cst.FunctionDef | cst.ClassDef | cst.Lambda):
            continue
        if isinstance(current, cst.Del):
            targets: list[cst.BaseExpression] = [current.target]
            while targets:
                target = targets.pop()
                if isinstance(target, cst.Name):
                    found.setdefault(target.value, None)
                elif isinstance(target, cst.Tuple | cst.List):
                    targets.extend(e.value for e in target.elements)
            continue
        stack.extend(children(current))
    return tuple(found)


def _made(group: list[Unit], returns: dict[str, None]) -> str | None:
    """A section with no heading nor prose above: named by what it does or makes."""
    if any(".backward(" in u.code for u in group):
        return "train"
    made = [n for n in returns if not n.startswith("_")]
    if 0 < len(made) <= 2:
        return "make " + " and ".join(made)
    return None


def _lead(markdown: str | None) -> str | None:
    """The words a section with no heading is named by: the markdown right above it."""
    if not markdown:
        return None
    first = re.split(r"(?<=[.!?:])\s|\n", markdown.strip(), maxsplit=1)[0]
    first = re.sub(r"^\s*#+\s*", "", first)
    return first if len(first.split()) <= 6 else None


def results(node: cst.BaseStatement, binds: tuple[str, ...]) -> tuple[str, ...]:
    """What a statement binds that is a result (`acc = evaluate(...)`, a total kept in a loop),
    not a loop variable nor an object built to be used (`ds = Dataset(...)`, `next(iter(dl))`)."""
    if isinstance(node, cst.FunctionDef | cst.ClassDef):
        return ()  # a definition kept in the script is passed on only where it is used
    loops: set[str] = set()
    if not isinstance(node, cst.SimpleStatementLine):  # a line of small statements has no loop
        for loop in find(node, cst.For):
            assert isinstance(loop, cst.For)
            loops.update(_names(loop.target))
        outer, inner = _by_depth(node)
        loops |= inner - outer  # bound only inside a loop in a loop: a batch's temporaries
    if isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Assign):
        small = node.body[0]
        single = len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
        if not single and _builds(small.value):
            return ()  # `xb, yb = next(iter(dl))`: (a lone unused name is returned: no F841)
    return tuple(n for n in binds if n not in loops)


def _by_depth(node: cst.CSTNode) -> tuple[set[str], set[str]]:
    """Names assigned at loop depth 0-1 (outer) and deeper (inner); defs are not entered."""
    outer: set[str] = set()
    inner: set[str] = set()
    stack: list[tuple[cst.CSTNode, int]] = [(node, 0)]
    while stack:
        current, depth = stack.pop()
        if not isa(current, _DEPTH):
            stack.extend((child, depth) for child in children(current))
            continue
        if isinstance(current, cst.FunctionDef | cst.ClassDef):
            continue
        if isinstance(current, cst.AssignTarget | cst.AugAssign | cst.AnnAssign):
            (outer if depth <= 1 else inner).update(_names(current.target))
        if isinstance(current, cst.For | cst.While):
            depth += 1
        stack.extend((child, depth) for child in children(current))
    return outer, inner


def built(node: cst.BaseStatement) -> tuple[str, ...]:
    """`ds = Dataset(...)`, `g = torch.Generator().manual_seed(0)`: the name of a built object."""
    if isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Assign):
        small = node.body[0]
        target = small.targets[0].target if len(small.targets) == 1 else None
        if isinstance(target, cst.Name) and _builds(small.value):
            return (target.value,)
    return ()


def _builds(value: cst.BaseExpression) -> bool:
    """A constructor call anywhere in a call chain (`torch.Generator().manual_seed(0)`), or
    `next(...)`."""
    while isinstance(value, cst.Call | cst.Attribute):
        func = value.func if isinstance(value, cst.Call) else value
        if isinstance(func, cst.Name):
            return func.value[:1].isupper() or func.value in ("next", "iter")
        if isinstance(func, cst.Attribute):
            if isinstance(value, cst.Call) and func.attr.value[:1].isupper():
                return True
            value = func.value
        else:
            return False
    return False


def _names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple | cst.List):
        return [n for e in target.elements for n in _names(e.value)]
    return []


def reads_of(code_reads: Iterable[str], callees: Iterable[str]) -> tuple[str, ...]:
    """A statement's reads followed by the names the functions it calls are given."""
    return tuple(dict.fromkeys([*code_reads, *callees]))
