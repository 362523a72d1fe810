"""
Step 3a: definitions are versions. A notebook is a sequence: `split_loss` is defined, called,
redefined and called again, and each call runs the definition that was live at that point when
the notebook ran top to bottom.

Every function and class defined more than once gets one version per definition, and so does
one whose name a later statement rebinds to a value (`def train_xgb`, then `train_xgb =
evaluate(...)`): the value keeps the name, each definition is a version (`train_xgb_v1`). A
top-level statement binds to the version live where it stands (only its reads are renamed:
`model = model()` calls a version and binds the plain name); a function's body to the version
live where it was defined (or, for a name defined only after it, the version live at the first
top-level statement that uses the function; the value, where a statement rebound the name
before that point). The versions something still calls are kept: the first under
the plain name, the later ones as `NAME_v2`, `NAME_v3` (by definition order), and the references
are renamed to match. A version nothing calls is dropped, with a note. The result, `Versions`,
is handed to the plan: the items in order (renamed) and the table of which call uses which.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst

from .analyze import BUILTINS, Item
from .read import Note
from .renames import local_names, rebound_imports, reserved_names
from .transform import rename_heads, rename_loads


@dataclass(frozen=True)
class Use:
    """A reference to a versioned name: where it is and which version it binds to."""

    cell: int
    line: int
    user: str  # the statement (`run`) or the definition that refers to it
    name: str
    version: str  # the name the kept version has in the package


@dataclass(frozen=True)
class Versions:
    items: tuple[Item, ...]  # the notebook's items in order, dropped versions left out
    uses: tuple[Use, ...]
    kept: tuple[tuple[str, tuple[str, ...]], ...]  # name -> the version names kept
    notes: tuple[Note, ...]


def resolve(items: list[Item], exported_only: bool = False) -> Versions:
    """Bind every reference of a name defined more than once to the version live there."""
    items, reserved = reserved_names(items)
    items, imported = rebound_imports(items)
    reserved = [*reserved, *imported]
    definitions: dict[str, list[int]] = {}  # name -> indexes in `items` of its definitions
    for index, item in enumerate(items):
        if item.kind in ("function", "class") and not item.train_cell and item.name:
            if exported_only and not item.cell.export:
                continue
            definitions.setdefault(item.name, []).append(index)
    # a definition whose name a later statement rebinds to a value (`train_xgb = evaluate(...)`
    # after `def train_xgb`, or `model = model()`): the value keeps the name, the definition
    # becomes a version of its own (`train_xgb_v1`), else a section that calls it and then
    # rebinds the name reads a local before it is bound (UnboundLocalError)
    # where a statement binds such a name: from there on the name is the value, not a version
    values: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        if item.kind in ("statement", "constant"):
            for name in definitions.keys() & set(item.binds):
                values.setdefault(name, []).append(index)
    values = {n: ix for n, ix in values.items() if ix[-1] > definitions[n][0]}
    rebound = set(values)
    multiple = {n: d for n, d in definitions.items() if len(d) > 1 or n in rebound}

    def version_at(name: str, point: int) -> int | None:
        """The definition live at `point`, None where a statement rebound the name since."""
        found = _live_at(multiple[name], point)
        value = _live_at(values.get(name, []), point)
        return None if found is None or (value is not None and value > found) else found

    if not multiple:
        return Versions(tuple(items), (), (), tuple(reserved))
    notes_early: list[Note] = reserved
    split: dict[int, tuple[str, dict[int, int | None]]] = {}  # def -> (name, point -> version)
    # which definition each reference binds to: (index of the referring item, name) -> def index
    callers = _call_points(items)
    live: dict[str, int] = {}
    binding: dict[tuple[int, str], int] = {}
    # what a definition's head (bases, decorators, defaults) reads runs where it stands: the
    # version live before it, itself not yet (`class Fraction(Fraction):` over an earlier one);
    # None: the plain name there (an import or a value)
    heads: dict[int, dict[str, int | None]] = {}
    for index, item in enumerate(items):
        if item.kind in ("function", "class") and set(item.at_definition) & set(multiple):
            heads[index] = {n: live.get(n) for n in item.at_definition if n in multiple}
        if item.name in multiple and index in multiple[item.name]:
            live[item.name] = index  # before its body: a recursive call is to itself
        is_def = item.kind in ("function", "class")
        own = local_names(item.node) if item.kind == "function" else set()
        for name in item.reads:
            if name not in multiple or name in own:
                continue
            if not is_def:
                if name in live:
                    binding[(index, name)] = live[name]
                continue
            # a body looks the name up when it runs: at the statements that call the def
            mine = definitions.get(item.name or "", [index])
            points = sorted(
                p for p in callers.get(index, ()) if p > index and _live_at(mine, p) == index
            )
            seen = [version_at(name, p) for p in points]
            found = [v for v in seen if v is not None]
            if name in values and None in seen:
                pass  # a call where the name is a value: the body reads the value, as it runs
            elif found:
                binding[(index, name)] = found[0]
                if len(set(found)) > 1 and item.name not in multiple:
                    split.setdefault(
                        index, (name, {p: _live_at(multiple[name], p) for p in points})
                    )
            elif name in live:
                binding[(index, name)] = live[name]
            elif name not in values:
                binding[(index, name)] = multiple[name][-1]
        if item.kind in ("statement", "constant"):
            for name in item.binds:
                live.pop(name, None)  # a plain rebinding: no version is live any more
    used: dict[str, set[int]] = {n: set() for n in multiple}
    for (_, name), target in binding.items():
        used[name].add(target)
    for name, at in split.values():
        used[name] |= {v for v in at.values() if v is not None}
    for head in heads.values():
        for name, live_there in head.items():
            if live_there is not None:
                used[name].add(live_there)
    # a version only another version of the same name uses (recursion) is not a use on its own
    taken = {n for it in items for n in it.binds} | set(BUILTINS)
    names: dict[int, str] = {}
    notes: list[Note] = notes_early
    kept: list[tuple[str, tuple[str, ...]]] = []
    for name, indexes in multiple.items():
        keep = sorted(used[name]) or [indexes[-1]]
        for position, index in enumerate(keep):
            if position == 0 and name not in rebound:
                names[index] = name
                continue
            number = indexes.index(index) + 1
            candidate = f"{name}_v{number}"
            while candidate in taken or keyword.iskeyword(candidate):
                candidate += "_"
            taken.add(candidate)
            names[index] = candidate
        kept.append((name, tuple(names[i] for i in keep)))
        for index in indexes:
            if index in keep:
                continue
            item = items[index]
            after = [items[i].cell.number for i in indexes if i > index]
            again = f"cell {after[0]}" if after else "a later cell"
            notes.append(
                Note(
                    item.cell.number,
                    item.line,
                    "redefined",
                    f"{name} is defined again in {again} before anything calls this version: "
                    "dropped",
                )
            )
    out: list[Item] = []
    uses: list[Use] = []
    drop = {i for ixs in multiple.values() for i in ixs if i not in names}
    clones, redirect = _clones(items, split, binding, names, taken, notes)
    for index, item in enumerate(items):
        if index in drop:
            continue
        renames = {
            name: names[target]
            for (user, name), target in binding.items()
            if user == index and target in names
        } | redirect.get(index, {})
        for name, version in sorted(renames.items()):
            user_name = item.name if item.kind in ("function", "class") else "run()"
            uses.append(Use(item.cell.number, item.line, user_name or "run()", name, version))
        new_name = names.get(index, item.name)
        changed = {k: v for k, v in renames.items() if k != v}
        # the head's reads: from what the body's renaming made of them to the version live
        # where the definition stands (or the plain name)
        at_head = {
            changed.get(n, n): names[t] if t is not None else n
            for n, t in heads.get(index, {}).items()
        }
        at_head = {k: v for k, v in at_head.items() if k != v}
        if not changed and not at_head and new_name == item.name:
            out.append(item)
            continue
        node = rename_loads(item.node, changed) if changed else item.node
        if at_head:
            node = rename_heads(node, at_head)
        if isinstance(node, cst.FunctionDef | cst.ClassDef) and new_name is not None:
            node = node.with_changes(name=cst.Name(new_name))
        reads = tuple(changed.get(r, r) for r in item.reads)
        reads = tuple(dict.fromkeys([*reads, *at_head.values()]))
        binds = tuple(names.get(index, b) if b == item.name else b for b in item.binds)
        out.append(dataclasses.replace(item, node=node, name=new_name, reads=reads, binds=binds))
    for behind, clone in clones:  # a copy of a caller, for each version it runs with
        position = next(
            (i for i, it in enumerate(out) if it.cell.number > items[behind].cell.number),
            len(out),
        )
        out.insert(position, clone)
    return Versions(tuple(out), tuple(uses), tuple(sorted(kept)), tuple(notes))


def _clones(
    items: list[Item],
    split: dict[int, tuple[str, dict[int, int | None]]],
    binding: dict[tuple[int, str], int],
    names: dict[int, str],
    taken: set[str],
    notes: list[Note],
) -> tuple[list[tuple[int, Item]], dict[int, dict[str, str]]]:
    """A function called where different versions of a name it uses are live runs a different
    version each time: one copy of it per version (`report`, `report_split_loss_v2`), and each
    statement calls the copy for the version live there."""
    clones: list[tuple[int, Item]] = []
    redirect: dict[int, dict[str, str]] = {}
    for index, (name, at) in split.items():
        item = items[index]
        assert item.name is not None
        first = binding[(index, name)]
        made: dict[int, str] = {first: item.name}
        for version in sorted({v for v in at.values() if v is not None and v != first}):
            candidate = f"{item.name}_{names[version]}"
            while candidate in taken:
                candidate += "_"
            taken.add(candidate)
            made[version] = candidate
            renames = {
                n: names[t] for (u, n), t in binding.items() if u == index and t in names
            } | {name: names[version]}
            node = rename_loads(item.node, {k: v for k, v in renames.items() if k != v})
            if isinstance(node, cst.FunctionDef | cst.ClassDef):
                node = node.with_changes(name=cst.Name(candidate))
            reads = tuple(renames.get(r, r) for r in item.reads)
            clones.append(
                (
                    version,
                    dataclasses.replace(
                        item, node=node, name=candidate, reads=reads, binds=(candidate,)
                    ),
                )
            )
        for point, live in at.items():
            if live in made and made[live] != item.name and item.name in items[point].reads:
                redirect.setdefault(point, {})[item.name] = made[live]
        notes.append(
            Note(
                item.cell.number,
                item.line,
                "kept",
                f"{item.name} runs with {len(made)} versions of {name}: kept as "
                + ", ".join(sorted(made.values())),
            )
        )
    return clones, redirect


def _live_at(indexes: list[int], at: int) -> int | None:
    before = [i for i in indexes if i < at]
    return before[-1] if before else None


def _call_points(items: list[Item]) -> dict[int, set[int]]:
    """For each definition (by index), the top-level statements that call it, directly or
    through other definitions (the name as it stands when the statement runs)."""
    by_name: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        if item.kind in ("function", "class") and item.name:
            by_name.setdefault(item.name, []).append(index)
    points: dict[int, set[int]] = {}
    for index, item in enumerate(items):
        if item.kind in ("function", "class"):
            continue
        for name in item.reads:
            target = _live_at(by_name.get(name, []), index)
            if target is not None:
                points.setdefault(target, set()).add(index)
    changed = True
    while changed:  # a definition called by a definition is called where that one is
        changed = False
        for index, item in enumerate(items):
            if item.kind not in ("function", "class"):
                continue
            for name in item.reads:
                for target in by_name.get(name, []):
                    if target == index:
                        continue
                    mine = points.get(index, set())
                    theirs = points.setdefault(target, set())
                    if not mine <= theirs:
                        theirs |= mine
                        changed = True
    return points


def table(versions: Versions) -> list[str]:
    """The report's lines: how many versions are kept, and which call uses which."""
    count = sum(len(v) for n, v in versions.kept if len(v) > 1 or n not in v)
    lines = [f"versions kept: {count}"]
    lines += [
        f"- `{name}` is rebound to a value by a later statement: the definition is "
        + ", ".join(f"`{v}`" for v in kept)
        for name, kept in versions.kept
        if name not in kept
    ]
    if versions.uses:
        lines += ["", "| cell | line | in | calls | version |", "| --- | --- | --- | --- | --- |"]
        lines += [
            f"| {u.cell} | {u.line} | `{u.user}` | `{u.name}` | `{u.version}` |"
            for u in versions.uses
        ]
    return lines


def renamed(versions: Versions) -> Mapping[str, tuple[str, ...]]:
    return dict(versions.kept)
