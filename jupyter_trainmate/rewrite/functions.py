"""
Notebook functions and methods the cell reaches: real notebooks keep the loop in a `train_epoch()`
or a `Trainer.fit()` defined cells earlier. Each is rewritten like the cell (from its source, which
IPython keeps in `linecache`) and swapped in for the cell's duration only (see `install`).

A function counts as the notebook's when IPython compiled it: its code's file name is one of the
cell names IPython's compiler produced (`ip.compile`, ipykernel's temporary cell files included,
wherever `TMPDIR` points), or, without a running shell, a source registered in `linecache` by a
compiler rather than read from a file. Code from imported modules is not rewritten; a note says so
when it trains.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import site
import sys
import sysconfig
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from .context import Note

# Decorators that return the function itself (typing's `no_type_check` only sets an attribute):
# a function carrying them is rewritten as if it had none.
NO_OP_DECORATORS = ("@no_type_check\n", "@typing.no_type_check\n")

Methods = set[tuple[str, str]]


@dataclass(frozen=True)
class FunctionSource:
    """A notebook function's or method's source, ready to rewrite.

    A method's `source` is its class line then the method as written (indented), so it parses,
    compiles with its class's name mangling, and keeps the user's columns.
    """

    name: str  # "train_epoch", or "Trainer.fit" for a method
    function: types.FunctionType
    source: str
    first_line: int  # of `source` in its cell (a method's class line is one above its `def`)
    owner: type | None = None  # the class a method is swapped on
    attr: str = ""  # the method's name on `owner`

    @property
    def kind(self) -> str:
        return "method" if self.owner is not None else "function"


def called_names(module: cst.CSTNode) -> tuple[set[str], Methods]:
    """Names called as `f(...)` or passed as `g(f)`, and `obj.method(...)` pairs, in `module`.

    `super().method(...)` is the pair `("super()", "method")`.
    """
    names: set[str] = set()
    methods: Methods = set()
    for call in m.findall(module, m.Call()):
        assert isinstance(call, cst.Call)
        func = call.func
        if isinstance(func, cst.Name):
            names.add(func.value)
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            methods.add((func.value.value, func.attr.value))
        elif isinstance(func, cst.Attribute) and m.matches(
            func.value, m.Call(func=m.Name("super"), args=[])
        ):
            methods.add(("super()", func.attr.value))
        # A function handed to another (`run(train_one_epoch)`) runs under it: reach it too.
        names.update(a.value.value for a in call.args if isinstance(a.value, cst.Name))
    return names, methods


def _shell_cell_files() -> Mapping[str, int] | None:
    """The cell file names the running IPython's compiler produced (name -> execution count)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    known = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return known if isinstance(known, dict) else None


def is_cell_file(filename: str) -> bool:
    """Whether `filename` names code IPython compiled from a cell, not a file on disk."""
    known = _shell_cell_files()
    if known is not None and filename in known:
        return True
    entry = linecache.cache.get(filename)
    # IPython's compilers register a cell's lines with no modification time (never re-read).
    return entry is not None and len(entry) == 4 and entry[1] is None


def _from_a_cell(fn: types.FunctionType) -> bool:
    """Defined in the notebook: in `__main__`, compiled from one of its cells.

    (attrs and the like register generated code in linecache too, in their users' modules.)
    """
    return fn.__module__ == "__main__" and is_cell_file(fn.__code__.co_filename)


def _source(fn: types.FunctionType) -> tuple[str, int] | str:
    """A function's source from its `def`, and its first line; or why it cannot be rewritten."""
    if fn.__closure__ and fn.__code__.co_freevars != ("__class__",):
        return "it is a closure (defined inside another function)"
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return "its source is not available"
    while lines and lines[0].lstrip().startswith(NO_OP_DECORATORS):
        lines, first = lines[1:], first + 1
    if not lines or not lines[0].lstrip().startswith(("def ", "async def ")):
        return "it is decorated: the decorator may wrap it"
    return "".join(lines), first


def notebook_function(
    name: str, namespace: Mapping[str, object], handed: frozenset[object] = frozenset()
) -> FunctionSource | str | None:
    """The function `name` if the notebook defined it (or it was `handed` to `train()`).

    A string says why a notebook function cannot be rewritten; None: not a notebook function.
    """
    fn = namespace.get(name)
    if not isinstance(fn, types.FunctionType):
        return None
    if fn not in handed and not _from_a_cell(fn):
        return None
    found = _source(fn)
    if isinstance(found, str):
        return found
    source, first = found
    if source[0] in " \t":  # a method or nested function bound to a name: not at the top level
        return "it is not defined at the top level of its cell"
    return FunctionSource(name, fn, source, first)


def notebook_method(cls: type, attr: str) -> FunctionSource | str | None:
    """The method `cls.attr` (found along the MRO) if a notebook class defines it."""
    for owner in cls.__mro__:
        if attr in vars(owner):
            fn = vars(owner)[attr]
            break
    else:
        return None
    if not isinstance(fn, types.FunctionType) or not _from_a_cell(fn):
        return None  # a static/class method, a property, or a library class's method
    found = _source(fn)
    if isinstance(found, str):
        return found
    source, first = found
    header = f"class {owner.__name__}:\n"
    return FunctionSource(f"{owner.__name__}.{attr}", fn, header + source, first - 1, owner, attr)


def bound_notebook_method(value: object) -> FunctionSource | str | None:
    """A bound method of a notebook class held by a name (`fit = trainer.fit`)."""
    if not isinstance(value, types.MethodType) or isinstance(value.__self__, type):
        return None
    func = value.__func__
    if not isinstance(func, types.FunctionType):
        return None
    return notebook_method(type(value.__self__), func.__name__)


@functools.cache
def _library_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    ours = str(Path(__file__).resolve().parent.parent)  # jupyter_trainmate itself
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return (ours, *{paths[k] for k in keys if k in paths}, *sites)


def module_code_that_trains(value: object) -> str | None:
    """`file.py` when `value` is a function of the user's own files (not the notebook's, not a
    library's) whose source calls backward()."""
    if not isinstance(value, types.FunctionType):
        return None
    filename = value.__code__.co_filename
    if filename.startswith(("<", *_library_paths())) or is_cell_file(filename):
        return None
    try:
        source = inspect.getsource(value)
    except (OSError, TypeError):
        return None
    return filename if ".backward(" in source else None


def module_notes(
    names: set[str], methods: Methods, lookup: Callable[[str], object], origin: str
) -> list[Note]:
    """Notes for calls into the user's own modules (`%%writefile` ones too): not rewritten.

    `lookup(name)` gives what the notebook's name holds.
    """
    notes = []
    for name in sorted(names):
        filename = module_code_that_trains(lookup(name))
        if filename is not None:
            notes.append(_module_note(origin, f"{name}()", filename))
    for obj, attr in sorted(methods):
        value = lookup(obj)
        if isinstance(value, types.ModuleType):
            filename = module_code_that_trains(getattr(value, attr, None))
            if filename is not None:
                notes.append(_module_note(origin, f"{obj}.{attr}()", filename))
    return notes


MODULE_CODE = "code in imported modules is not rewritten; optimizer hooks still count its steps"


def _module_note(origin: str, what: str, filename: str) -> Note:
    return Note("left alone", origin, f"{what} from {filename}", MODULE_CODE)


TypeOf = Callable[[str], type | None]
