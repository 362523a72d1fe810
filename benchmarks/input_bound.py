"""An input-bound loop: does `%%train` hide data loading behind compute?

The dataset spends about 0.2 ms per sample in `__getitem__` waiting on I/O (a sleep, as a file read
would: it releases the GIL), batch 32, `num_workers=0`; the model is sized so a training step takes
about as long as loading its batch, with one torch thread. The best any loop can do is the overlap
bound max(data, compute) per step, both measured alone in the same script. Each mode's figure is
bound time / run time (1.0 = perfect overlap), median over alternating runs.

`--parts` times what the default's thread path adds, apart: the `--prefetch auto` probe (once per
loader and run), starting and stopping the loading thread (once per pass), and handing a batch
over through its queue (once per batch, measured on ready-made batches so no loading hides it).

    python benchmarks/input_bound.py [REPEATS] [STEPS] [WIDTH] [--parts]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)

class SlowDataset(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 256)
        self.y = torch.randint(0, 10, (n,))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        time.sleep(0.0002)  # I/O wait, as reading a file
        return self.x[i], self.y[i]

data = SlowDataset(32 * STEPS)
model = nn.Sequential(nn.Linear(256, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
"""
LOOP = """
for xb, yb in LOADER:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
"""
MODES = {
    "plain loop, num_workers=0": ("", "DataLoader(data, batch_size=32)"),
    "plain loop, num_workers=2": ("", "DataLoader(data, batch_size=32, num_workers=2)"),
    "%%train (default: --prefetch auto)": (
        "%%train\n",
        "DataLoader(data, batch_size=32)",
    ),
    "%%train --prefetch thread (opt-in)": (
        "%%train --prefetch thread\n",
        "DataLoader(data, batch_size=32)",
    ),
}


def timed(ip: InteractiveShell, cell: str) -> float:
    started = time.perf_counter()
    ip.run_cell(cell, silent=True).raise_error()
    return time.perf_counter() - started


def main(repeats: int = 5, steps: int = 40, width: int = 1600) -> None:
    torch.set_num_threads(1)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP.replace("STEPS", str(steps)).replace("WIDTH", str(width))).raise_error()
    data_alone = "batches = []\nfor b in DataLoader(data, batch_size=32):\n    batches.append(b)\n"
    compute_alone = LOOP.replace("LOADER", "batches")
    cells = {
        name: prefix + LOOP.replace("LOADER", loader) for name, (prefix, loader) in MODES.items()
    }
    cells["data alone"] = data_alone
    cells["compute alone"] = compute_alone
    times: dict[str, list[float]] = {name: [] for name in cells}
    for cell in cells.values():  # warm-up
        timed(ip, cell)
    for _ in range(repeats):
        for name, cell in cells.items():
            times[name].append(timed(ip, cell))
    median = {name: statistics.median(t) for name, t in times.items()}
    data, compute = median["data alone"], median["compute alone"]
    bound = max(data, compute)
    print(
        f"input-bound: data {data / steps * 1e3:.2f} ms/step, compute {compute / steps * 1e3:.2f} "
        f"ms/step alone; bound {bound / steps * 1e3:.2f} ms/step ({steps} steps, median of {repeats})"
    )
    for name in MODES:
        print(
            f"  {name:48s} {median[name] / steps * 1e3:6.2f} ms/step  {bound / median[name]:.2f} of the bound"
        )


def _median_us(fn: Callable[[], object], runs: int) -> float:
    spent = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent) * 1e6


def parts(runs: int = 200) -> dict[str, float]:
    """The thread path's own costs, in microseconds (wall time, medians of `runs`)."""
    from torch.utils.data import DataLoader

    from jupyter_trainmate.runtime.prefetch import ThreadPrefetcher, auto_thread

    torch.set_num_threads(1)
    namespace: dict[str, Any] = {}
    exec(SETUP.replace("STEPS", "40").replace("WIDTH", "16"), namespace)
    loader = DataLoader(namespace["data"], batch_size=32)
    assert auto_thread(loader) is None  # the probe picks the thread for this loader
    ready = [(torch.randn(32, 256), torch.randint(0, 10, (32,))) for _ in range(100)]

    def through_thread() -> None:
        for _ in ThreadPrefetcher(ready):
            pass

    def plainly() -> None:
        for _ in ready:
            pass

    figures = {
        "probe (per loader and run)": _median_us(lambda: auto_thread(loader), runs),
        "thread start + stop (per pass)": _median_us(lambda: ThreadPrefetcher([]).close(), runs),
        "hand-off through the queue (per batch)": (
            _median_us(through_thread, runs) - _median_us(plainly, runs)
        )
        / len(ready),
        "one batch of this dataset (for scale)": _median_us(
            lambda: next(iter(loader)), max(runs // 10, 5)
        ),
    }
    for name, value in figures.items():
        print(f"  {name:40s} {value:8.0f} us")
    return figures


if __name__ == "__main__":
    if "--parts" in sys.argv[1:]:
        parts()
    else:
        main(*(int(a) for a in sys.argv[1:4]))
