"""Run the training loops of public notebooks plainly and under `%%train`; compare and count.

    python benchmarks/loops_corpus.py FOLDER [--only NAME] [--manifest benchmarks/loops_corpus.toml]

FOLDER holds the notebooks the manifest lists (fetched at the commits it gives; they are not part
of this repository). For each notebook a small program is built from its own code cells, unchanged
but for the substitutions the manifest lists (iteration counts, data-set sizes), after a prelude
that puts small synthetic tensors in place of the data set. The training cell then runs in a
fresh IPython shell plainly, and in another under `%%train`; the script prints whether every
trained tensor (module state, leaf tensors, results) ended bit-identical, the counts the summary
reports against the true ones, what the live progress showed at the end, and the rewrite's notes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import tomllib
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from jupyter_trainmate import last_run
from jupyter_trainmate.runtime import session as session_module

# Run first in every program: the notebooks' plotting and helper packages are replaced by
# stand-ins that do nothing (the data they plot is not what is compared).
COMMON = '''
import sys, types
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

class _Nothing:
    """Any attribute, call, index or unpacking gives another _Nothing: plots become no-ops."""
    def __getattr__(self, name): return _Nothing()
    def __call__(self, *args, **kwargs): return _Nothing()
    def __getitem__(self, key): return _Nothing()
    def __iter__(self): return iter((_Nothing(), _Nothing()))
    def __setitem__(self, key, value): pass

def _attribute(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Nothing()

for _name in ("matplotlib", "matplotlib.pyplot", "matplotlib.gridspec", "matplotlib.animation"):
    _module = types.ModuleType(_name)
    _module.__getattr__ = _attribute
    sys.modules[_name] = _module
import matplotlib.pyplot as plt

d2l = types.ModuleType("d2lzh_pytorch")
def _sgd(params, lr, batch_size):
    for p in params:
        p.data -= lr * p.grad / batch_size
d2l.sgd = _sgd
d2l.semilogy = lambda *args, **kwargs: None
sys.modules["d2lzh_pytorch"] = d2l
from IPython.display import display, clear_output
from torch.optim.lr_scheduler import StepLR
torch.set_num_threads(1)
'''


@dataclass
class Entry:
    name: str
    repository: str
    path: str
    commit: str
    file: str
    shape: str
    cells: list[int | str]
    train: int
    data: str
    expected: dict[str, int]
    replace: dict[str, str] = field(default_factory=dict)
    ignore: list[str] = field(default_factory=list)  # names holding wall-clock times


@dataclass
class Outcome:
    identical: bool
    differing: list[str]
    plain_optimizer_steps: int
    summary: dict[str, int]
    progress: dict[str, Any]
    notes: list[str]
    seconds: float
    error: str = ""
    samples_source: str = ""  # how the summary counted samples (see RunSummary.samples_source)


def load(manifest: Path) -> list[Entry]:
    with manifest.open("rb") as f:
        raw = tomllib.load(f)
    return [Entry(**item) for item in raw["notebook"]]


def program(entry: Entry, folder: Path) -> tuple[list[str], str]:
    """The setup cells and the training cell, from the notebook's own code cells."""
    notebook = nbformat.read(folder / entry.file, as_version=4)
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]

    def cell(index: int) -> str:
        source = str(code[index])
        for old, new in entry.replace.items():
            source = source.replace(old, new)
        return source

    setup = [COMMON]
    data = entry.data.replace("{corpus}", str(folder.resolve()))  # files fetched beside them
    for item in entry.cells:
        setup.append(data if item == "data" else cell(int(item)))
    return setup, cell(entry.train)


def fresh_shell() -> InteractiveShell:
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    return ip


def state(ip: InteractiveShell) -> dict[str, Any]:
    """Everything trained or computed that the two runs must agree on, by name."""
    found: dict[str, Any] = {}

    def add(name: str, value: Any, depth: int = 0) -> None:
        if isinstance(value, torch.nn.Module):
            for key, tensor in value.state_dict().items():
                found[f"{name}.{key}"] = tensor.detach().clone()
        elif isinstance(value, torch.Tensor):
            found[name] = value.detach().clone()
        elif isinstance(value, np.ndarray) and value.dtype != object:
            found[name] = value.copy()
        elif isinstance(value, float | int) and not isinstance(value, bool):
            found[name] = value
        elif isinstance(value, list | tuple) and depth < 2:
            for i, item in enumerate(value):
                add(f"{name}[{i}]", item, depth + 1)

    for name, value in ip.user_ns.items():
        if not name.startswith("_") and name not in {"In", "Out"}:
            add(name, value)
    return found


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b, equal_nan=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


INTERRUPTIONS: list[str] = []  # what each interrupted run reported (its events), for the report


def interrupted(ip: InteractiveShell, cell: str, before: int) -> None:
    """Run `cell`, stopped by a KeyboardInterrupt just before its `before`-th optimizer step:
    after that batch's backward(), where a Ctrl-C lands most often (backward() is long)."""
    seen = 0

    def stop(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == before:
            raise KeyboardInterrupt

    handle = register_optimizer_step_pre_hook(stop)
    try:
        ip.run_cell(cell)
    finally:
        handle.remove()
    summary = last_run()
    if summary is None or summary.outcome != "interrupted":
        raise RuntimeError(f"the run was not interrupted at optimizer step {before}")
    INTERRUPTIONS[:] = list(summary.events)


def run(
    setup: list[str],
    train: str,
    line: str | None,
    repeat: int = 1,
    then_plain: bool = False,
    interrupt_at: int = 0,
) -> tuple[InteractiveShell, int]:
    """Run the program in a fresh shell; the training cell (`repeat` times, as a user runs a cell
    again) plainly or under `%%train LINE`, then once more plainly if `then_plain`. With
    `interrupt_at`, the `%%train` run is first interrupted before that optimizer step and then
    run again with `--resume` (LINE names the `--checkpoint` folder)."""
    ip = fresh_shell()
    for source in setup:
        ip.run_cell(source).raise_error()
    if interrupt_at and line is not None:
        interrupted(ip, f"%%train {line}\n{train}", interrupt_at)
        line = f"{line} --resume"
    steps = 0

    def count(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal steps
        steps += 1

    handle = register_optimizer_step_post_hook(count)
    try:
        cell = train if line is None else f"%%train {line}\n{train}"
        for _ in range(repeat):
            steps = 0  # the last run's, as the summary reports it
            ip.run_cell(cell).raise_error()
    finally:
        handle.remove()
    if then_plain:
        ip.run_cell(train).raise_error()
    return ip, steps


def measure(
    entry: Entry,
    folder: Path,
    line: str,
    repeat: int = 1,
    then_plain: bool = False,
    interrupt_at: int = 0,
) -> Outcome:
    setup, train = program(entry, folder)
    started = time.perf_counter()
    progress: dict[str, Any] = {}
    original_close = session_module.TrainSession.close

    def close(self: session_module.TrainSession, outcome: Any) -> Any:
        seen = self.progress()  # what the widget and the status file show at the end
        progress.update(
            steps=seen.steps,
            epoch=seen.epoch,
            epochs_total=seen.epochs_total,
            steps_per_epoch=seen.steps_per_epoch,
            samples=seen.samples,
            fraction=seen.fraction,
        )
        return original_close(self, outcome)

    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            plain_ip, plain_steps = run(setup, train, None, repeat, then_plain)
            plain = state(plain_ip)
            session_module.TrainSession.close = close  # type: ignore[method-assign]
            try:
                trained_ip, _ = run(setup, train, line, repeat, then_plain, interrupt_at)
            finally:
                session_module.TrainSession.close = original_close  # type: ignore[method-assign]
            trained = state(trained_ip)
    except Exception as exc:
        return Outcome(False, [], 0, {}, {}, [], time.perf_counter() - started, f"{exc!r}"[:300])
    for name in entry.ignore:
        plain.pop(name, None)
        trained.pop(name, None)
    differing = sorted(
        k
        for k in plain.keys() | trained.keys()
        if k not in plain or k not in trained or not same(plain[k], trained[k])
    )
    summary = last_run()
    assert summary is not None
    counts = {
        "steps": summary.steps,
        "epochs": summary.epochs,
        "samples": summary.samples,
        "optimizer_steps": summary.optimizer_steps,
    }

    notes = [*summary.instrumented, *summary.left_alone, *summary.events]
    if interrupt_at:
        notes += [f"interrupted run: {event}" for event in INTERRUPTIONS]
    return Outcome(
        identical=not differing,
        differing=differing,
        plain_optimizer_steps=plain_steps,
        summary=counts,
        progress=progress,
        notes=notes,
        seconds=time.perf_counter() - started,
        samples_source=summary.samples_source,
    )


def report(entry: Entry, outcome: Outcome) -> str:
    lines = [f"== {entry.name}  ({entry.repository}:{entry.path}@{entry.commit[:8]})"]
    lines.append(f"   shape: {entry.shape}")
    if outcome.error:
        lines.append(f"   ERROR: {outcome.error}")
        return "\n".join(lines)
    verdict = "bit-identical" if outcome.identical else f"DIFFERS: {outcome.differing[:6]}"
    lines.append(f"   {verdict} ({outcome.seconds:.1f} s)")
    wrong = []
    for key, true in entry.expected.items():
        got = outcome.summary.get(key)
        mark = "ok" if got == true else "WRONG"
        if key == "samples" and outcome.samples_source == "none":
            mark = "not counted (the summary says so)"
        elif key == "samples" and outcome.samples_source == "batch dim 0":
            mark += " (counted as a guess, and the summary says so)"
        if mark.startswith("WRONG"):  # a wrong guess too (the final table says "no" for it)
            wrong.append(key)
        lines.append(f"   {key:9s} reported {got!s:>6}  true {true!s:>6}  {mark}")
    opt = outcome.summary.get("optimizer_steps")
    mark = "ok" if opt == outcome.plain_optimizer_steps else "WRONG"
    lines.append(
        f"   optimizer steps reported {opt} / plain run {outcome.plain_optimizer_steps}  {mark}"
    )
    lines.append(f"   live progress at the end: {outcome.progress}")
    lines.append("   counts: " + ("all right" if not wrong else "wrong: " + ", ".join(wrong)))
    lines += [f"   | {note}" for note in outcome.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("folder", type=Path)
    parser.add_argument(
        "--manifest", type=Path, default=Path(__file__).with_name("loops_corpus.toml")
    )
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--line", default="", help="options for %%train (default: none)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the training cell this many times in a row"
    )
    parser.add_argument(
        "--then-plain", action="store_true", help="then run the training cell once more, plainly"
    )
    parser.add_argument(
        "--interrupt-at",
        type=int,
        default=0,
        help="interrupt the %%%%train run before this optimizer step, then run it with --resume "
        "(each notebook gets its own --checkpoint folder)",
    )
    args = parser.parse_args(argv)
    entries = [e for e in load(args.manifest) if not args.only or e.name in args.only]
    failures = 0
    rows = []
    for entry in entries:
        if not (args.folder / entry.file).exists():
            print(
                f"== {entry.name}: {args.folder / entry.file} is missing (fetch {entry.repository}@{entry.commit}:{entry.path})"
            )
            failures += 1
            continue
        line = args.line
        if args.interrupt_at:  # a fresh checkpoint folder per notebook
            line = f"{line} --checkpoint {tempfile.mkdtemp(prefix='loops-ckpt-')}"
        outcome = measure(entry, args.folder, line, args.repeat, args.then_plain, args.interrupt_at)
        print(report(entry, outcome), flush=True)
        counts_right = all(
            outcome.summary.get(k) == v or (k == "samples" and outcome.samples_source == "none")
            for k, v in entry.expected.items()
        )
        rows.append((entry.name, outcome.identical and not outcome.error, counts_right))
        failures += int(bool(outcome.error) or not outcome.identical)
    print("\nnotebook                       bit-identical  counts right (or said not counted)")
    for name, identical, counts in rows:
        print(f"{name:30s} {'yes' if identical else 'NO':13s}  {'yes' if counts else 'no'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
