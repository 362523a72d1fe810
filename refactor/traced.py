"""
`--execute`: the types recorded while the notebook ran (see `trace`), as `Ty`s.

The union of what each parameter received and each function returned, shrunk to the nearest
common base class past three members; tensors as `torch.Tensor` with their dtypes and shapes
kept for the docstring. A type that was seen is never written as `Any`; a callable argument is
left unannotated (no sound signature was observed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .symbols import Package
from .typeexpr import NONE, TENSOR, T, Ty, join


@dataclass(frozen=True)
class Recorded:
    params: dict[str, dict[str, Ty]] = field(default_factory=dict)  # function key -> ...
    returns: dict[str, Ty] = field(default_factory=dict)
    shapes: dict[str, list[str]] = field(default_factory=dict)  # "x: float32[64, 3] (cpu)"
    globals: dict[str, Ty] = field(default_factory=dict)  # each notebook global at the end


class _Reader:
    def __init__(self, pkg: Package) -> None:
        self.pkg = pkg
        self.by_name = {key.rsplit(".", 1)[-1]: key for key in pkg.classes}

    def one(self, d: dict[str, Any]) -> Ty | None:
        kind = d.get("kind")
        if kind == "tensor":
            return TENSOR
        if kind == "tuple":
            items = [self.one(i) for i in d["items"]]
            if not items or None in items:
                return None
            return T("tuple", *items)  # type: ignore[arg-type]
        if kind != "object":
            return None  # callables: no signature was observed
        name = str(d["type"])
        if name in ("NoneType", "builtins.NoneType"):
            return NONE
        if name.startswith("__main__."):
            short = name.removeprefix("__main__.")
            if short in self.by_name:
                return T(self.by_name[short])
            for base in d.get("bases", []):
                if not base.startswith(("__main__.", "typing.")):
                    return T(str(base))
            return None
        if name == "list" and "item" in d:
            inner = self.one(d["item"])
            return T("list", inner) if inner is not None and inner != NONE else None
        if name == "dict" and "dict_key" in d and "dict_value" in d:
            key, value = self.one(d["dict_key"]), self.one(d["dict_value"])
            if key is None or value is None or NONE in (key, value):
                return None
            return T("dict", key, value)
        if name in ("list", "dict", "set", "tuple"):
            return None  # their items were not recorded
        return T(name)

    def union(self, seen: list[dict[str, Any]]) -> Ty | None:
        types = [self.one(d) for d in seen]
        if not types or None in types:
            return None
        parts: list[Ty] = sorted({t for t in types if t is not None and t != NONE}, key=str)
        if {str(p) for p in parts} == {"int", "float"}:
            parts = [T("float")]
        if len(parts) > 3:  # shrink: the nearest base class every value shares
            common = join(parts, self._ancestors(seen))
            if common is None:
                return None
            parts = [common]
        items = [*parts, NONE] if NONE in types else parts
        if not items:
            return None
        return items[0] if len(items) == 1 else T("|", *items)

    def _ancestors(self, seen: list[dict[str, Any]]) -> Any:
        chains = {str(d.get("type")): [str(d.get("type")), *d.get("bases", [])] for d in seen}

        def ancestors(name: str) -> list[str]:
            if name in self.pkg.classes:
                return self.pkg.ancestors(name)
            return [
                c for c in chains.get(name, [name]) if not c.startswith(("__main__.", "typing."))
            ]

        return ancestors


def shapes(name: str, seen: list[dict[str, Any]]) -> list[str]:
    found = []
    for d in seen:
        if d.get("kind") == "tensor":
            text = f"{d['dtype']}[{', '.join(map(str, d['shape']))}] ({d['device']})"
            if text not in found:
                found.append(text)
    return [f"{name}: {', '.join(found[:3])}"] if found else []


def recorded(
    pkg: Package,
    trace: dict[str, list[dict[str, Any]]] | None,
    globals_seen: dict[str, Any] | None = None,
) -> Recorded:
    """The traced calls of the package's functions, by function key (`.train.fit`)."""
    if not trace and not globals_seen:
        return Recorded()
    reader = _Reader(pkg)
    keys = {fn.qualname: key for key, fn in pkg.functions.items()}
    out = Recorded()
    for qualname, calls in (trace or {}).items():
        key = keys.get(qualname)
        if key is None or not calls:
            continue
        params: dict[str, Ty] = {}
        lines: list[str] = []
        for name in calls[0]["args"]:
            seen = [c["args"][name] for c in calls if name in c["args"]]
            ty = reader.union(seen)
            if ty is not None:
                params[name] = ty
            lines += shapes(name, seen)
        out.params[key] = params
        returned = reader.union([c["return"] for c in calls])
        if returned is not None:
            out.returns[key] = returned
        lines += shapes("returns", [c["return"] for c in calls])
        if lines:
            out.shapes[key] = lines
    for name, d in (globals_seen or {}).items():
        ty = reader.one(d)
        if ty is not None and ty != NONE:
            out.globals[name] = ty
    return out
