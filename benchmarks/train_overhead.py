"""`%%train` overhead on a tiny model, where per-step costs show most.

A 64-128-10 MLP, batch 64, in-memory batches, one torch thread: the same training cell plainly
and under `%%train` (default options, default display), in one IPython shell, alternating runs.
The figure is the median of the per-pair ratios (each %%train run against the plain run just
before it), which cancels most of this machine's drift (goal: <= 1.02).

Each round also runs the plain cell a second time, after the `%%train` run: its ratio to the
round's first plain run, taken the same way, is an A/A control. It should read 1.000; how far it
reads from 1.000 is how much of a difference this machine, at this moment, can show.

`--cpu` times each run in CPU time of the process (`time.process_time`: every thread, the
display's included) instead of wall time, for a shared, loaded machine where wall time measures
the neighbours.

    python benchmarks/train_overhead.py [REPEATS] [EPOCHS] [--cpu]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
batches = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(100)]
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
"""
LOOP = """
for epoch in range(EPOCHS):
    for xb, yb in batches:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
"""


def main(repeats: int = 31, epochs: int = 5, cpu: bool = False) -> dict[str, float]:
    clock = time.process_time if cpu else time.perf_counter
    torch.set_num_threads(1)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    loop = LOOP.replace("EPOCHS", str(epochs))
    cells = {"plain": loop, "train": "%%train\n" + loop, "control": loop}
    times: dict[str, list[float]] = {name: [] for name in cells}
    for name in cells:  # warm-up
        ip.run_cell(cells[name], silent=True).raise_error()
    for _ in range(repeats):
        for name, cell in cells.items():
            started = clock()
            ip.run_cell(cell, silent=True).raise_error()
            times[name].append(clock() - started)
    plain, train = statistics.median(times["plain"]), statistics.median(times["train"])
    ratio = statistics.median(t / p for p, t in zip(times["plain"], times["train"], strict=True))
    control = statistics.median(
        c / p for p, c in zip(times["plain"], times["control"], strict=True)
    )
    steps = epochs * 100
    print(
        f"overhead: plain {plain / steps * 1e6:.0f} us/step, %%train {train / steps * 1e6:.0f} us/step, "
        f"ratio {ratio:.3f} (median of {repeats} alternating pairs of {steps}-step runs, "
        f"{'CPU' if cpu else 'wall'} time)\n"
        f"A/A control: the plain cell again / plain {control:.3f} (the same pairs; 1.000 on a "
        "machine quiet enough to read the ratio above to its third digit)"
    )
    return {"plain_s": plain, "train_s": train, "ratio": ratio, "control": control}


if __name__ == "__main__":
    numbers = [int(a) for a in sys.argv[1:] if a != "--cpu"]
    main(*numbers[:2], cpu="--cpu" in sys.argv[1:])
