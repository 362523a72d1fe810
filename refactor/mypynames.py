"""
mypy's types as the annotation steps write them (`Ty`): classes by a public path the package can
import (the one the notebook imported where there is one: `torch.Tensor` for mypy's
`torch._tensor.Tensor`), the builtins and their generics, tuples, unions of a few members,
`None`; `None` for anything else (a callable, a type variable, `Any` at the top).
"""

from __future__ import annotations

from typing import Any

from .typeexpr import ANY, ELLIPSIS, GENERICS, NONE, UNION, T, Ty, join

# builtins a type may name as they are (the others, `map`, `zip`, `enumerate`, say little)
_BUILTINS = frozenset({"int", "float", "str", "bool", "bytes", "complex", "range", "slice"})
_MAX_UNION = 3
_MAX_TUPLE = 32  # a section function returns what later sections read


class Names:
    """mypy's types as `Ty`: classes by a public path the package can import."""

    def __init__(self, modules: dict[str, Any], package: str, preferred: set[str]) -> None:
        self.modules = modules
        self.package = package
        self.preferred = preferred
        self.memo: dict[str, str | None] = {}

    def join(self, types: list[Any], loose: bool = False) -> Ty | None:
        """One type for all of `types`; `loose`: a tuple's items it cannot write are `Any` (to
        fill in the `Any` items of a tuple we typed: the others stay ours)."""
        if not types:
            return None
        found = [self.ty(t, loose=loose) for t in types]
        if any(t is None for t in found):
            return None
        return join(found, self.ancestors)

    def ty(self, typ: Any, inner: bool = False, loose: bool = False) -> Ty | None:
        from mypy.types import (
            AnyType,
            Instance,
            LiteralType,
            NoneType,
            TupleType,
            TypeType,
            UnionType,
            get_proper_type,
        )

        if typ == "None":
            return NONE
        if typ is None:
            return None
        typ = get_proper_type(typ)
        if isinstance(typ, AnyType):
            return ANY if inner else None
        if isinstance(typ, NoneType):
            return NONE
        if isinstance(typ, LiteralType):
            typ = typ.fallback
        if isinstance(typ, TupleType) and typ.partial_fallback.type.fullname != "builtins.tuple":
            return self.instance(typ.partial_fallback, inner)  # a NamedTuple: its class
        if isinstance(typ, TupleType):
            if len(typ.items) > _MAX_TUPLE:
                return None
            items = [self.ty(i, inner=True) for i in typ.items]
            if loose:
                items = [ANY if i is None else i for i in items]
            if any(i is None for i in items) or all(i == ANY for i in items):
                return None
            return T("tuple", *items)  # type: ignore[arg-type]
        if isinstance(typ, UnionType):
            flat: list[Ty] = []
            for item in typ.items:
                m = self.ty(item)
                if m is None:
                    return None
                for one in m.args if m.name == UNION else (m,):
                    if one not in flat:
                        flat.append(one)
            if len([m for m in flat if m != NONE]) > _MAX_UNION:
                return None
            return flat[0] if len(flat) == 1 else T(UNION, *flat)
        if isinstance(typ, TypeType):
            inner_ty = self.ty(typ.item)
            return T("type", inner_ty) if inner_ty is not None and inner_ty.is_class else None
        if isinstance(typ, Instance):
            return self.instance(typ, inner)
        return None

    def instance(self, typ: Any, inner: bool) -> Ty | None:
        full = typ.type.fullname
        if "@" in full:  # a class defined in a function (`train.Model@122`): no name reaches it
            return ANY if inner else None
        module, _, last = full.rpartition(".")
        if module == "builtins":
            if last in _BUILTINS:
                return T(last)
            if last == "object":  # the join of unlike values (`{"lr": 0.1, "name": "a"}`)
                return ANY if inner else None
            if last in GENERICS and last != "type":
                args = [self.ty(a, inner=True) for a in typ.args]
                if last == "tuple":  # a tuple of any length: `tuple[int, ...]`
                    return T("tuple", args[0], T(ELLIPSIS)) if args and args[0] else None
                if any(a is None for a in args):
                    return T(last)
                return T(last, *args)  # type: ignore[arg-type]
            return None
        if full.startswith(self.package + "."):
            return T("." + full[len(self.package) + 1 :])
        public = self.public(full)
        return T(public) if public is not None else None

    def public(self, full: str) -> str | None:
        """A path by which `full` can be imported: one the package imports it by if any, else
        the shortest through modules that re-export it, with no private part."""
        if full in self.memo:
            return self.memo[full]
        module, _, last = full.rpartition(".")
        parts = module.split(".")
        found: list[str] = []
        for n in range(1, len(parts) + 1):
            prefix = ".".join(parts[:n])
            if any(p.startswith("_") for p in parts[:n]):
                break
            if prefix == module:
                found.append(full)
                continue
            tree = self.modules.get(prefix)
            node = tree.names.get(last) if tree is not None else None
            if node is not None and getattr(node, "fullname", None) == full:
                found.append(f"{prefix}.{last}")
        if not found and not any(p.startswith("_") for p in parts) and last[:1] != "_":
            found.append(full)
        chosen = next((f for f in found if f in self.preferred), found[0] if found else None)
        self.memo[full] = chosen
        return chosen

    def ancestors(self, name: str) -> list[str]:
        """`name` and its bases, as public paths (for the join of several classes)."""
        full = self.package + name if name.startswith(".") else name
        info = self._info(full)
        if info is None:
            return [name]
        chain = []
        for base in info.mro:
            if base.fullname == "builtins.object":
                break
            if base.fullname.startswith(self.package + "."):
                chain.append("." + base.fullname[len(self.package) + 1 :])
            else:
                public = self.public(base.fullname)
                if public is not None:
                    chain.append(public)
        return chain or [name]

    def _info(self, full: str) -> Any:
        from mypy.nodes import TypeInfo

        module, _, last = full.rpartition(".")
        while module:
            tree = self.modules.get(module)
            if tree is not None:
                node = tree.names.get(last)
                found = node.node if node is not None else None
                return found if isinstance(found, TypeInfo) else None
            module, _, head = module.rpartition(".")
            last = f"{head}.{last}"  # a nested class: `Outer.Inner`
        return None
