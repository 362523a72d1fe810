"""Trial-epochs saved by median pruning at an equal best value, on a reference task.

The task: a 2-layer MLP on a synthetic 16-feature classification (an XOR of two sums, so it needs
the hidden layer), 1,024 training samples in batches of 64, the validation loss logged after each
of EPOCHS epochs; the search: the learning rate (1e-4..1, log) and the momentum (0..0.95) of SGD,
TPE with a seed. The same `%%train --sweep TRIALS` cell runs with each `--prune` of PRUNERS
(default `median`) and with `--prune none` for each seed; the figures are the trial-epochs each ran
(from the run records) and the best validation loss each found (goal: at least 40% fewer epochs,
the same best value: "same" counts a better one too, "WORSE" is printed where it is worse).

    python benchmarks/sweep_pruning.py [TRIALS] [EPOCHS] [SEEDS] [PRUNERS, e.g. median,hyperband]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import jupyter_trainmate
torch.manual_seed(0)
x = torch.randn(1536, 16)
y = (x[:, :4].sum(dim=1) * x[:, 4:8].sum(dim=1) > 0).long()
train_loader = DataLoader(TensorDataset(x[:1024], y[:1024]), batch_size=64, shuffle=True)
val_x, val_y = x[1024:], y[1024:]
loss_fn = nn.CrossEntropyLoss()

def validate(model):
    with torch.no_grad():
        return loss_fn(model(val_x), val_y).item()
"""
CELL = """%%train --sweep TRIALS --monitor val_loss --seed SEED --prune PRUNE --display off --tensorboard off
lr = jupyter_trainmate.suggest("lr", 1e-4, 1.0, log=True)
momentum = jupyter_trainmate.suggest("momentum", 0.0, 0.95)
torch.manual_seed(1)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
for epoch in range(EPOCHS):
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss_fn(model(xb), yb).backward()
        optimizer.step()
    jupyter_trainmate.log(val_loss=validate(model))
"""


def epochs_of(study: str) -> int:
    lines = (Path("runs") / "runs.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return sum(r["summary"]["epochs"] for r in records if r.get("sweep", {}).get("study") == study)


def main(
    trials: int = 20, epochs: int = 10, seeds: int = 8, pruners: str = "median"
) -> dict[str, float]:
    import jupyter_trainmate

    torch.set_num_threads(1)
    os.chdir(tempfile.mkdtemp(prefix="sweep-pruning-"))
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    names = pruners.split(",")
    rows = []
    for seed in range(seeds):
        row: dict[str, float] = {"seed": seed}
        for prune in ("none", *names):
            cell = CELL.replace("TRIALS", str(trials)).replace("EPOCHS", str(epochs))
            ip.run_cell(cell.replace("SEED", str(seed)).replace("PRUNE", prune)).raise_error()
            summary = jupyter_trainmate.last_sweep()
            assert summary is not None
            assert summary.best_value is not None
            row[f"{prune}_epochs"] = epochs_of(summary.study)
            row[f"{prune}_best"] = summary.best_value
            row[f"{prune}_pruned"] = summary.count("pruned")
        parts = [
            f"seed {seed}: no pruning {row['none_epochs']:.0f} trial-epochs, best "
            f"{row['none_best']:.4f}"
        ]
        for prune in names:
            row[f"{prune}_saved"] = 1 - row[f"{prune}_epochs"] / row["none_epochs"]
            worse = row[f"{prune}_best"] > row["none_best"]
            parts.append(
                f"{prune} {row[f'{prune}_epochs']:.0f} ({row[f'{prune}_pruned']:.0f} pruned), "
                f"best {row[f'{prune}_best']:.4f}{' WORSE' if worse else ''}, "
                f"saved {row[f'{prune}_saved']:.0%}"
            )
        rows.append(row)
        print("; ".join(parts), file=sys.stderr)
    result: dict[str, float] = {"best_no_pruning": statistics.mean(r["none_best"] for r in rows)}
    for prune in names:
        result[f"{prune}_saved_mean"] = statistics.mean(r[f"{prune}_saved"] for r in rows)
        result[f"{prune}_best"] = statistics.mean(r[f"{prune}_best"] for r in rows)
        result[f"{prune}_worse_seeds"] = sum(r[f"{prune}_best"] > r["none_best"] for r in rows)
        print(
            f"sweep pruning ({trials} trials x {epochs} epochs, {seeds} seeds): --prune {prune} "
            f"ran {result[f'{prune}_saved_mean']:.0%} fewer trial-epochs; mean best val_loss "
            f"{result[f'{prune}_best']:.4f} pruned, {result['best_no_pruning']:.4f} unpruned; "
            f"worse best value on {result[f'{prune}_worse_seeds']:.0f} of {seeds} seeds",
            file=sys.stderr,
        )
    return result


if __name__ == "__main__":
    args = sys.argv[1:]
    numbers = [int(a) for a in args[:3]]
    if len(args) > 3:
        main(*numbers, pruners=args[3])
    else:
        main(*numbers)
