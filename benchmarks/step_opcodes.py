"""Where `%%train`'s extra Python runs, function by function, in Python opcodes.

`step_instructions.py` says how many instructions `%%train` adds per step and per run; this says
which Python functions they come from. It runs `train_overhead.py`'s cell (64-128-10 MLP, batch
64, in-memory batches, one torch thread) plainly and under `%%train` (defaults, the text view) at
100 and 300 steps, with `sys.settrace` and `f_trace_opcodes` on the training thread (the thread
the loop runs on; the display thread is not traced), and counts the opcodes each function
executes. Per function, the extra of the `%%train` cell over the plain one at both lengths gives
a slope (opcodes a step) and an intercept (opcodes a run). The step timer's stride is pinned as
in `step_instructions.py` (one step in 62 timed), so the counts do not follow the slowdown that
tracing brings. Each cell is run once before it is counted (imports, caches: a re-run).

Opcodes are not instructions (a `CALL` into torch is one opcode): use it to find the Python, and
`step_instructions.py` to weigh it. A per-run count moves by a few hundred between identical
runs (the timed points' jitter).

    python benchmarks/step_opcodes.py [TOP] [--lines QUALNAME[,QUALNAME...]]

`--lines` also prints, for the functions named (`Batches._iterate_plain`), the opcodes a step of
each of their lines in the 300-step `%%train` run.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

Key = tuple[str, str, int]  # file (from site-packages/, jupyter_trainmate/ or lib/), name, line


def _key(frame: FrameType) -> Key:
    code = frame.f_code
    name = code.co_filename
    for marker in ("site-packages/", "jupyter_trainmate/", "lib/python3"):
        at = name.find(marker)
        if at >= 0:
            name = name[at:]
            break
    return name, code.co_qualname, code.co_firstlineno


class Counter:
    """Opcodes per function (and per line of the functions watched) of the traced thread."""

    def __init__(self, watched: set[str]) -> None:
        self.functions: collections.Counter[Key] = collections.Counter()
        self.lines: collections.Counter[tuple[str, int]] = collections.Counter()
        self._watched = watched

    def tracer(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        key = _key(frame)
        functions, lines = self.functions, self.lines
        watched = key[1] in self._watched

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                functions[key] += 1
                if watched:
                    lines[(key[1], frame.f_lineno or 0)] += 1
            return local

        return local

    def run(self, ip: Any, cell: str) -> tuple[collections.Counter[Key], collections.Counter[Any]]:
        self.functions.clear()
        self.lines.clear()
        gc.collect()
        sys.settrace(self.tracer)
        try:
            ip.run_cell(cell, silent=True).raise_error()
        finally:
            sys.settrace(None)
        return collections.Counter(self.functions), collections.Counter(self.lines)


def main(top: int, watched: set[str]) -> None:
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    sys.path.insert(0, str(Path(__file__).parent))
    from step_instructions import STRIDE, slow_clocks
    from train_overhead import LOOP, SETUP

    torch.set_num_threads(1)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    os.chdir(tempfile.mkdtemp(prefix="step-opcodes-"))  # run records, event files
    slow_clocks(30.0, STRIDE)
    counter = Counter(watched)
    found: dict[tuple[str, int], collections.Counter[Key]] = {}
    lines: collections.Counter[Any] = collections.Counter()
    for epochs in (1, 3):
        loop = LOOP.replace("EPOCHS", str(epochs))
        cells = {"plain": loop, "train": "%%train\n" + loop}
        for cell in cells.values():  # warm-up
            ip.run_cell(cell, silent=True).raise_error()
        for name, cell in cells.items():
            found[(name, epochs)], by_line = counter.run(ip, cell)
            if (name, epochs) == ("train", 3):
                lines = by_line
    extra = {}
    for epochs in (1, 3):
        difference = found[("train", epochs)].copy()
        difference.subtract(found[("plain", epochs)])
        extra[epochs] = difference
    keys = set(extra[1]) | set(extra[3])
    step = {k: (extra[3][k] - extra[1][k]) / 200 for k in keys}
    run = {k: extra[1][k] - step[k] * 100 for k in keys}
    plain = (sum(found[("plain", 3)].values()) - sum(found[("plain", 1)].values())) / 200
    print(f"plain step: {plain:,.1f} opcodes")
    print(f"%%train per step: +{sum(step.values()):,.1f} opcodes")
    for k, v in sorted(step.items(), key=lambda kv: -abs(kv[1]))[:top]:
        if abs(v) >= 0.5:
            print(f"  {v:9.1f}  {k[1]}  ({k[0]}:{k[2]})")
    print(f"%%train per run: +{sum(run.values()):,.0f} opcodes")
    for k, v in sorted(run.items(), key=lambda kv: -abs(kv[1]))[:top]:
        print(f"  {v:9.0f}  {k[1]}  ({k[0]}:{k[2]})")
    if watched:
        print("per line, opcodes a step of the 300-step %%train run:")
        for (name, line), n in sorted(lines.items()):
            if n >= 30:  # 0.1 a step
                print(f"  {name}:{line}  {n / 300:.2f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    names: set[str] = set()
    if "--lines" in args:
        at = args.index("--lines")
        names = set(args[at + 1].split(","))
        del args[at : at + 2]
    main(int(args[0]) if args else 30, names)
