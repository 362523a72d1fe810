"""
Step 3a, first: the names that change before the versions are counted. A notebook definition
of one of the package's own names (`run`, `Config`) is renamed, and an imported name a later
binding replaces (a value, or the notebook's own definition, with reads between the two) becomes
a version of its own (`NAME_v1`), which the code before the replacement reads (`versions`
counts the definitions' versions after this).
"""

from __future__ import annotations

import dataclasses
import keyword

import libcst as cst

from .analyze import BUILTINS, Item
from .read import Note
from .transform import aliased_import, rename_heads, rename_loads, rename_reads


def local_names(fn: cst.CSTNode) -> set[str]:
    """The parameters of a def: names it binds itself, not references to a global."""
    found: set[str] = set()
    if isinstance(fn, cst.FunctionDef):
        p = fn.params
        for param in [*p.posonly_params, *p.params, *p.kwonly_params]:
            found.add(param.name.value)
        for star in (p.star_arg, p.star_kwarg):
            if isinstance(star, cst.Param):
                found.add(star.name.value)
    return found


RESERVED = {"run": "run_notebook", "Config": "NotebookConfig", "resolve_device": "resolve_device_"}


def reserved_names(items: list[Item]) -> tuple[list[Item], list[Note]]:
    """The package's own names (`run`, `Config`): a notebook definition of one is renamed, and
    so is an import of one (`from utils.hyperparameters import Config as NotebookConfig`: the
    package's `train.py` imports its own `Config`, F811 and the wrong class otherwise)."""
    defined = {it.name for it in items if it.kind in ("function", "class")}
    imported = {n for it in items if it.kind == "import" for n in it.binds}
    renames = {old: new for old, new in RESERVED.items() if old in defined | imported}
    if not renames:
        return items, []
    out: list[Item] = []
    notes: list[Note] = []
    for item in items:
        if item.kind == "import":
            out.append(_reserved_import(item, renames, notes))
            continue
        hit = {k: v for k, v in renames.items() if k in item.reads or k == item.name}
        if not hit:
            out.append(item)
            continue
        node = rename_reads(item.node, hit)
        name = hit.get(item.name or "", item.name)
        if isinstance(node, cst.FunctionDef | cst.ClassDef) and name is not None:
            node = node.with_changes(name=cst.Name(name))
            notes.append(
                Note(item.cell.number, item.line, "kept", f"{item.name}: renamed {name} (the "
                     "package's own name)")
            )  # fmt: skip
        reads = tuple(hit.get(r, r) for r in item.reads)
        binds = tuple(hit.get(b, b) for b in item.binds)
        out.append(dataclasses.replace(item, node=node, name=name, reads=reads, binds=binds))
    return out, notes


def _reserved_import(item: Item, renames: dict[str, str], notes: list[Note]) -> Item:
    """An import binding a name of `renames`, bound under the new name instead."""
    node, binds = item.node, item.binds
    for old, new in renames.items():
        aliased = aliased_import(node, old, new) if old in binds else None
        if aliased is None:
            continue  # not bound here, or `import a.b` (binds `a`: no alias binds the same)
        node, binds = aliased, tuple(new if b == old else b for b in binds)
        notes.append(
            Note(item.cell.number, item.line, "kept", f"{old}: imported as `{new}` (the "
                 "package's own name)")
        )  # fmt: skip
    return dataclasses.replace(item, node=node, binds=binds)


def rebound_imports(items: list[Item]) -> tuple[list[Item], list[Note]]:
    """An imported name a later statement rebinds (`from tqdm import tqdm`, then `tqdm =
    partial(tqdm, leave=True)`) is a version too: the import binds `tqdm_v1`, the statements up
    to and including the rebinding read that, and the value keeps the name. A section function
    holding the rebinding would otherwise read its own local `tqdm` before binding it.

    So is one a later `def` or `class` of the same name replaces when something between the two
    reads it (`from torchvision import transforms`, `transforms.ToTensor()`, then the notebook's
    own `def transforms`): the import binds `transforms_v1`, the statements between read that,
    and so do the functions defined between (a body binds to the version live where it was
    defined) and the definition's own head; the definition keeps the name. Without a read
    between, the import was dead: the package uses the definition, as before (the report says
    so)."""
    imported: dict[str, int] = {}  # name -> index of the import item binding it now
    rebound: dict[str, tuple[int, int]] = {}  # name -> (import index, rebinding index)
    redefined: set[str] = set()  # of `rebound`: replaced by a definition, not by a value
    read_since: dict[str, bool] = {}  # an imported name: read since its import
    for index, item in enumerate(items):
        if item.kind == "import":
            imported.update(dict.fromkeys(item.binds, index))
            read_since.update(dict.fromkeys(item.binds, False))
        elif item.kind in ("statement", "constant"):
            for name in item.binds:
                if name in imported and name not in rebound:
                    rebound[name] = (imported.pop(name), index)
        elif item.name in imported:
            at = imported.pop(item.name)
            if read_since[item.name] and item.name not in rebound and not item.train_cell:
                rebound[item.name] = (at, index)
                redefined.add(item.name)
        for name in item.reads:
            if name in imported and (item.kind != "function" or name not in local_names(item.node)):
                read_since[name] = True
    if not rebound:
        return items, []
    taken = {n for it in items for n in it.binds} | set(BUILTINS)
    out = list(items)
    notes: list[Note] = []
    for name, (at, until) in sorted(rebound.items(), key=lambda kv: kv[1]):
        alias = f"{name}_v1"
        while alias in taken or keyword.iskeyword(alias):
            alias += "_"
        node = aliased_import(out[at].node, name, alias)
        if node is None:
            continue  # `import a.b` binds `a`: no alias can bind the same
        taken.add(alias)
        binds = tuple(alias if b == name else b for b in out[at].binds)
        out[at] = dataclasses.replace(out[at], node=node, binds=binds)
        for index in range(at + 1, until + 1):
            item = out[index]
            if item.kind in ("statement", "constant") and name in item.reads:
                reads = tuple(alias if r == name else r for r in item.reads)
                node = rename_loads(item.node, {name: alias})
                out[index] = dataclasses.replace(item, node=node, reads=reads)
            elif name in redefined and item.kind in ("function", "class"):
                out[index] = _reading(item, name, alias, head_only=index == until)
        later = out[until]
        if name in redefined:
            what = f"defines its own `{name}`, which keeps the name; the code before it reads the import"
        else:
            what = f"rebinds `{name}` to a value, which keeps the name"
        notes.append(
            Note(
                out[at].cell.number,
                out[at].line,
                "kept",
                f"{name}: imported as `{alias}`: cell {later.cell.number} {what}",
            )
        )
    return out, notes


def _reading(item: Item, name: str, alias: str, *, head_only: bool) -> Item:
    """A definition between an import and the definition replacing it, reading the import as
    `alias`: in its head (decorators, defaults, bases), and unless `head_only` (the replacing
    definition itself) in its body, where the body does not bind the name itself."""
    at_definition = tuple(alias if r == name else r for r in item.at_definition)
    node = rename_heads(item.node, {name: alias}) if name in item.at_definition else item.node
    reads = item.reads
    if not head_only and name in reads and name not in local_names(item.node):
        node = rename_reads(node, {name: alias})
        reads = tuple(alias if r == name else r for r in reads)
    elif name in item.at_definition and alias not in reads:
        reads = (*reads, alias)
    return dataclasses.replace(item, node=node, reads=reads, at_definition=at_definition)
