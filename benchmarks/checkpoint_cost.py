"""What checkpointing costs: the quickstart workload (10 epochs of an MLP on 7168 samples) plainly
under `%%train` and under `%%train --checkpoint DIR` (default interval: each epoch's end, plus the
per-step bookkeeping that lets an interrupted step be resumed), alternating, in one IPython shell.
Median of per-pair ratios; goal under 1.02."""

from __future__ import annotations

import statistics
import tempfile
import time

import torch
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x = torch.randn(8192, 20)
y = (x @ torch.randn(20, 4)).argmax(dim=1)
train_loader = DataLoader(TensorDataset(x[:7168], y[:7168]), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(20, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
loss_fn = nn.CrossEntropyLoss()
"""
LOOP = """
for epoch in range(10):
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
"""


def main(repeats: int = 11) -> float:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    with tempfile.TemporaryDirectory() as tmp:
        cells = {
            "train": "%%train --display off\n" + LOOP,
            "checkpointed": f"%%train --display off --checkpoint {tmp}\n" + LOOP,
        }
        times: dict[str, list[float]] = {k: [] for k in cells}
        for cell in cells.values():
            ip.run_cell(cell, silent=True).raise_error()
        for _ in range(repeats):
            for name, cell in cells.items():
                started = time.perf_counter()
                ip.run_cell(cell, silent=True).raise_error()
                times[name].append(time.perf_counter() - started)
    ratio = statistics.median(
        c / t for t, c in zip(times["train"], times["checkpointed"], strict=True)
    )
    print(
        f"checkpointing at each epoch end: {statistics.median(times['checkpointed']):.2f} s vs "
        f"{statistics.median(times['train']):.2f} s per 10-epoch run, ratio {ratio:.3f} "
        f"(median of {repeats} pairs, torch {torch.__version__})"
    )
    return ratio


if __name__ == "__main__":
    main()
