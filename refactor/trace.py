"""
`--execute`: run the notebook in a kernel (nbclient) and record how its functions were called.

A first cell (added to a copy; the notebook itself is never touched) registers an IPython
`post_run_cell` hook that wraps each function and each class's public methods (and `__init__`,
`__len__`, `__getitem__`) as the notebook defines them. A wrapper records, for the first calls,
the type of every argument and of the result (for tensors their dtype, shape and device, for
integer tensors also their smallest and largest value; ints keep their value; for a list or a
dict whose first items share one type, that item, key and value type) under
the shortest public name of the type (`torch.optim.AdamW`, not `torch.optim.adamw.AdamW`) and its
bases. It also keeps small input/output fixtures of functions that take and return tensors, and
a last cell keeps only those that draw no random numbers (Python's and torch's generator states
are unchanged by a second call) and give the same result again: they become characterisation
tests. The random number generators start seeded (`equivalence.SEED`, string hashing too), as
the package's run for `--check-equivalence` does. The run happens in a fresh temporary folder
holding a copy of the files beside the notebook (`workdir`), with a time limit; a cell that fails is reported with what it needed (a file, the network, ...).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from jupyter_trainmate.errors import TrainmateError

from .equivalence import HASH_SEED, SEED
from .workdir import LIMIT, stage

TRACE_FILE = "__trainmate_trace__.json"
FIXTURE_FILE = "__trainmate_fixtures__.pt"

SETUP = r"""
def __trainmate_tracer__():
    import functools, importlib, inspect, itertools, types
    ip = get_ipython()
    calls, fixtures, done = {}, {}, set()
    MAX_CALLS, MAX_FIXTURE = 16, 4096

    def alias(t):
        parts = t.__module__.split(".")
        for n in range(1, len(parts) + 1):
            prefix = ".".join(parts[:n])
            try:
                if getattr(importlib.import_module(prefix), t.__qualname__, None) is t:
                    return f"{prefix}.{t.__qualname__}" if prefix != "builtins" else t.__qualname__
            except Exception:
                pass
        return f"{t.__module__}.{t.__qualname__}"

    def describe(v, depth=0):
        import torch
        if isinstance(v, torch.Tensor):
            out = {"kind": "tensor", "dtype": str(v.dtype).removeprefix("torch."),
                   "shape": list(v.shape), "device": v.device.type}
            if v.numel() and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool):
                try:  # integer tensors (indices, lengths, labels): the range fixtures keep to
                    out["min"], out["max"] = int(v.min()), int(v.max())
                except Exception:
                    pass
            return out
        if isinstance(v, tuple) and depth < 2 and len(v) <= 6 and not hasattr(v, "_fields"):
            return {"kind": "tuple", "items": [describe(i, depth + 1) for i in v]}
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, functools.partial)):
            return {"kind": "callable"}
        t = type(v)
        mro = [alias(b) for b in t.__mro__[1:6] if b is not object]
        out = {"kind": "object", "type": alias(t), "bases": mro}
        if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 200):
            out["value"] = v  # small literals: the generated tests construct with them
        if isinstance(v, list) and v and depth < 1 and same(v[:8]):
            out["item"] = describe(v[0], depth + 1)
        if isinstance(v, dict) and v and depth < 1:
            sample = list(itertools.islice(v.items(), 8))
            if same([k for k, _ in sample]) and same([x for _, x in sample]):
                out["dict_key"] = describe(sample[0][0], depth + 1)
                out["dict_value"] = describe(sample[0][1], depth + 1)
        return out

    def same(values):  # the items looked at share one type: the first stands for them all
        return len({type(x) for x in values}) == 1

    def small(v):
        import torch
        if isinstance(v, torch.Tensor):
            return v.numel() <= MAX_FIXTURE and v.device.type == "cpu"
        if isinstance(v, (tuple, list)) and len(v) <= 6:
            return all(small(i) for i in v)
        return isinstance(v, (int, float, bool, str, type(None)))

    def clone(v):
        import torch
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
        if isinstance(v, (tuple, list)):
            return type(v)(clone(i) for i in v)
        return v

    def wrap(name, fn, method=False):
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return fn
        @functools.wraps(fn)
        def traced(*args, **kwargs):
            result = fn(*args, **kwargs)
            seen = calls.setdefault(name, [])
            new_instance = method and args and len(seen) < 4 * MAX_CALLS and all(
                r.get("instance") != id(args[0]) for r in seen
            )  # every object's first call too: __len__ and __getitem__ of each dataset
            if len(seen) < MAX_CALLS or new_instance:
                try:
                    bound = sig.bind(*args, **kwargs)
                    record = {"args": {k: describe(v) for k, v in bound.arguments.items()
                                       if not (method and k == "self")},
                              "return": describe(result)}
                    if method and args:
                        record["instance"] = id(args[0])  # pairs __init__ with __len__ etc.
                    seen.append(record)
                    plain = not method and name not in fixtures
                    if plain and small(list(bound.arguments.values())) and small(result):
                        fixtures[name] = (clone(dict(bound.arguments)), clone(result))
                except Exception:
                    pass
            return result
        traced.__trainmate_traced__ = fn
        return traced

    def after_cell(result=None):
        ns = ip.user_ns
        for name, value in list(ns.items()):
            if name.startswith("_"):
                continue
            if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
                if not hasattr(value, "__trainmate_traced__"):
                    ns[name] = wrap(name, value)
            elif isinstance(value, type) and value.__module__ == "__main__" and value not in done:
                done.add(value)
                for attr, member in list(vars(value).items()):
                    public = not attr.startswith("_") or attr in ("__init__", "__len__", "__getitem__", "__call__")
                    if public and isinstance(member, types.FunctionType):
                        setattr(value, attr, wrap(f"{value.__name__}.{attr}", member, method=True))

    def numbers(ns):
        import torch
        found = {}
        for name, v in ns.items():
            if name.startswith("_") or isinstance(v, bool):
                continue
            if isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point():
                v = v.item()
            if isinstance(v, (int, float)):
                found[name] = float(v)
            elif isinstance(v, (list, tuple)) and 0 < len(v) <= 50:
                flat = [x for i in v for x in (i if isinstance(i, (list, tuple)) else (i,))]
                if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in flat):
                    found[name] = [float(x) for x in flat]
        return found

    def finish(trace_file, fixture_file):
        import json, torch
        results = numbers(ip.user_ns)  # before anything below can change the state
        dropped = {}
        kinds = {}
        for name, v in ip.user_ns.items():
            if name.startswith("_") or isinstance(v, (types.ModuleType, type, types.FunctionType)):
                continue
            try:
                kinds[name] = describe(v)
            except Exception:
                pass
        kept = {}
        for name, (arguments, expected) in fixtures.items():
            fn = ip.user_ns.get(name)
            fn = getattr(fn, "__trainmate_traced__", fn)
            try:
                import random
                states = (random.getstate(), torch.get_rng_state())
                again = fn(**clone(arguments))
                if (random.getstate(), torch.get_rng_state())[0] != states[0] or not torch.equal(
                    torch.get_rng_state(), states[1]
                ):
                    dropped[name] = "it draws random numbers"
                    continue  # no fixed expected output
                same = describe(again) == describe(expected)
                if same and isinstance(expected, torch.Tensor):
                    same = torch.equal(again, expected)
                elif same and isinstance(expected, (tuple, list)):
                    same = all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                               for a, b in zip(again, expected))
                if same:
                    kept[name] = (arguments, expected)
                else:
                    dropped[name] = "a second call gave another result"
            except Exception as exc:
                dropped[name] = f"a second call failed ({type(exc).__name__})"
        with open(trace_file, "w") as f:
            json.dump({"calls": calls, "fixtures": sorted(kept), "results": results,
                       "globals": kinds, "dropped": dropped}, f)
        torch.save(kept, fixture_file)

    ip.events.register("post_run_cell", after_cell)
    return finish, numbers

__trainmate_finish__, __trainmate_numbers__ = __trainmate_tracer__()
del __trainmate_tracer__
"""


@dataclass
class Trace:
    calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fixtures: dict[str, Any] = field(default_factory=dict)  # name -> (kwargs, result)
    results: dict[str, Any] = field(default_factory=dict)  # the notebook's numbers at its end
    globals: dict[str, Any] = field(default_factory=dict)  # the type of each global at its end
    dropped: dict[str, str] = field(default_factory=dict)  # function -> why it has no fixture
    seconds: float = 0.0


def execute(
    notebook: Path, skip_cells: set[int], timeout: int, kept: Mapping[int, str] | None = None
) -> Trace:
    """Run a traced copy of `notebook` in a fresh folder; a failing cell is a one-line error.
    A skipped cell runs only its `kept` code (the imports of a cell that does not parse)."""
    import time

    import torch
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(notebook, as_version=4)  # type: ignore[no-untyped-call]
    numbered = list(enumerate(nb.cells, start=1))
    kept = kept or {}
    cells, positions = [], []
    for number, cell in numbered:
        if number in skip_cells:
            if number not in kept:
                continue
            cell = nbformat.v4.new_code_cell(kept[number])  # type: ignore[no-untyped-call]
        cells.append(cell)
        positions.append(number)
    with tempfile.TemporaryDirectory(prefix="trainmate-execute-") as tmp:
        folder = Path(tmp)
        left_out = stage(notebook, folder)  # the files beside the notebook: its data
        trace_file, fixture_file = folder / TRACE_FILE, folder / FIXTURE_FILE
        first = nbformat.v4.new_code_cell(SEED + SETUP)  # type: ignore[no-untyped-call]
        last = nbformat.v4.new_code_cell(  # type: ignore[no-untyped-call]
            f"__trainmate_finish__({str(trace_file)!r}, {str(fixture_file)!r})"
        )
        nb.cells = [first, *cells, last]
        client = NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": tmp}}
        )
        started = time.perf_counter()
        try:
            client.execute(  # the kernel's own warnings: not ours
                stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": HASH_SEED}
            )
        except CellTimeoutError:
            raise TrainmateError(
                f"{notebook}: --execute: a cell ran longer than {timeout} s (--timeout)"
            ) from None
        except DeadKernelError as exc:
            raise TrainmateError(f"{notebook}: --execute: the kernel died ({exc})") from None
        except CellExecutionError as exc:
            raise TrainmateError(_failure(notebook, nb, positions, exc, left_out)) from None
        recorded = json.loads(trace_file.read_text())
        fixtures = torch.load(fixture_file, weights_only=True)
        return Trace(
            recorded["calls"],
            fixtures,
            recorded["results"],
            recorded["globals"],
            recorded["dropped"],
            time.perf_counter() - started,
        )


def _failure(
    notebook: Path,
    nb: nbformat.NotebookNode,
    positions: list[int],
    exc: Any,
    left_out: Sequence[str] = (),
) -> str:
    """Which cell failed and why, in a line: a missing file or no network said plainly."""
    failed = None
    for index, cell in enumerate(nb.cells):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            failed = index
            break
    where = f"cell {positions[failed - 1]}" if failed and 0 < failed <= len(positions) else "a cell"
    name = getattr(exc, "ename", "") or "error"
    value = (getattr(exc, "evalue", "") or "").strip().splitlines()
    detail = value[0][:160] if value else ""
    if name in ("FileNotFoundError", "IsADirectoryError") or "No such file" in detail:
        why = f"needs a file it cannot find in the fresh working folder ({detail})"
        if left_out:  # beside the notebook, but too large to copy there
            why += f"; not copied there (over {LIMIT >> 20} MiB in all): {', '.join(left_out)}"
    elif name in ("ConnectionError", "URLError", "gaierror", "ConnectError", "HTTPError") or (
        "Name or service not known" in detail
        or "Temporary failure in name resolution" in detail
        or detail.startswith("Error downloading")  # torchvision's data sets, after each mirror
    ):
        why = f"needs the network ({name}: {detail})"
    else:
        why = f"failed: {name}: {detail}"
    return f"{notebook}: --execute: {where} {why}"
