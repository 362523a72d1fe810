"""Per-trial overhead of `%%train --sweep` against a hand-written Optuna objective.

The same training loop (an MLP on in-memory batches, one torch thread), the same study settings
(random sampler, same seed, no pruning, the same JournalStorage file backend under runs/), the
same metric logged once per epoch: once as the body of a `%%train --sweep T` cell in an IPython
shell (default options, so the text view and run records), once as a hand-written
`objective(trial)` that calls `trial.suggest_float`, trains, reports and returns the best value,
run by `study.optimize`. Both report the metric to the trial at each epoch (a journal write each).
The two alternate in pairs, after two warm-up pairs; the figure is the median of the per-pair
ratios of the time per trial (goal: <= 1.05). `--cpu` times CPU time of the process (all threads)
instead of wall time, for a shared, loaded machine. `--lean` runs the trials with
`--display off --tensorboard off --prefetch off` (what the display, TensorBoard and the CPU
prefetch thread cost apart). `--kept`: the hand-written side opens the journal once and keeps it
for every sweep, as `%%train --sweep` does since issue 15's round 2 (without it, each hand-written
sweep opens the journal anew, replaying every record in it: a cost that grows over the run).
`--order=ab` (the default: the hand-written sweep first in each pair), `ba` (the `%%train` one
first) or `abba` (swapped every other pair, which cancels what running second does to a side).
`STEPS`: batches per epoch (default 50); with a few (`8 16 1 2`), a trial is nearly all fixed
cost, so the ratio shows the per-trial and per-sweep costs apart from the per-step ones.

The garbage collector's pauses of each side are printed too (`gc_watch.py`): they are not what
spreads the pairs (BENCHMARKS.md, 2026-12-01 evening).

    python benchmarks/sweep_overhead.py [PAIRS] [TRIALS] [EPOCHS] [STEPS] [--cpu] [--lean] [--kept]
        [--order=ab|ba|abba]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from gc_watch import Collections
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch
from torch import nn
import jupyter_trainmate
torch.manual_seed(0)
batches = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(STEPS)]
val = (torch.randn(256, 64), torch.randint(0, 10, (256,)))
loss_fn = nn.CrossEntropyLoss()
"""
# The loop both sides run; `LR` comes from suggest() in the cell, from the trial in the objective.
LOOP = """
torch.manual_seed(1)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=LR)
for epoch in range(EPOCHS):
    for xb, yb in batches:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    with torch.no_grad():
        REPORT(val_loss=loss_fn(model(val[0]), val[1]).item())
"""

HAND = """
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

def objective(trial):
    LR = trial.suggest_float("lr", 1e-3, 0.3, log=True)
    best = float("inf")
    step = 0
    def REPORT(val_loss):
        nonlocal best, step
        best = min(best, val_loss)
        trial.report(val_loss, step)
        step += 1
        trial.should_prune()
BODY
    return best

KEPT = None

def hand_sweep(name, trials):
    global KEPT
    storage = KEPT or JournalStorage(JournalFileBackend("runs/optuna.journal"))
    if KEEP:
        KEPT = storage
    study = optuna.create_study(
        storage=storage, study_name=name, sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=optuna.pruners.NopPruner(),
    )
    study.optimize(objective, n_trials=trials)
    return study
"""


def main(
    pairs: int = 7,
    trials: int = 8,
    epochs: int = 4,
    steps: int = 50,
    cpu: bool = False,
    lean: bool = False,
    kept: bool = False,
    order: str = "ab",
) -> dict[str, float]:
    clock = time.process_time if cpu else time.perf_counter
    torch.set_num_threads(1)
    os.chdir(tempfile.mkdtemp(prefix="sweep-overhead-"))
    Path("runs").mkdir()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP.replace("STEPS", str(steps))).raise_error()
    loop = LOOP.replace("EPOCHS", str(epochs))
    body = "\n".join("    " + line for line in loop.strip().splitlines())
    ip.run_cell(HAND.replace("BODY", body).replace("KEEP:", f"{kept}:")).raise_error()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cell = (
        f"%%train --sweep {trials} --monitor val_loss --sampler random --seed 0 --prune none"
        + (" --display off --tensorboard off --prefetch off" if lean else "")
        + "\n"
        'LR = jupyter_trainmate.suggest("lr", 1e-3, 0.3, log=True)\n'
        + loop.replace("REPORT(", "jupyter_trainmate.log(")
    )
    ratios, hand_s, train_s = [], [], []
    collecting = Collections()

    # The first two pairs warm up both (imports, the rewrite cache): the cell's rewrite reads the
    # namespace, which the first sweep fills (model, opt, ...), so the second sweep rewrites once
    # more (about 90 ms, a cost per cell and namespace, not per trial).
    def run_hand() -> float:
        with collecting.side("hand" if i > 1 else None):
            start = clock()
            ip.run_cell(f"hand_sweep('hand-{i}', {trials})").raise_error()
            return (clock() - start) / trials

    def run_train() -> float:
        with collecting.side("train" if i > 1 else None):
            start = clock()
            ip.run_cell(cell).raise_error()
            return (clock() - start) / trials

    for i in range(pairs + 2):
        if order == "ba" or (order == "abba" and i % 2):
            train = run_train()
            hand = run_hand()
        else:
            hand = run_hand()
            train = run_train()
        if i > 1:
            ratios.append(train / hand)
            hand_s.append(hand)
            train_s.append(train)
    result = {
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "hand_s_per_trial": statistics.median(hand_s),
        "train_s_per_trial": statistics.median(train_s),
        "overhead_ms_per_trial": 1000 * (statistics.median(train_s) - statistics.median(hand_s)),
    }
    print(
        f"sweep overhead ({'cpu' if cpu else 'wall'} time{', lean' if lean else ''}"
        f"{', journal kept' if kept else ''}, order {order}, {pairs} pairs of {trials} trials x "
        f"{epochs} epochs x {steps} steps): %%train --sweep / hand-written objective = "
        f"{result['ratio_median']:.3f} (median; range {result['ratio_min']:.3f}-"
        f"{result['ratio_max']:.3f}); per trial {result['hand_s_per_trial'] * 1000:.0f} ms hand, "
        f"{result['train_s_per_trial'] * 1000:.0f} ms %%train "
        f"({result['overhead_ms_per_trial']:+.0f} ms)",
        file=sys.stderr,
    )
    print(f"gc pauses over the timed pairs: {collecting.line()}", file=sys.stderr)
    return result


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(
        *(int(a) for a in args),
        cpu="--cpu" in sys.argv,
        lean="--lean" in sys.argv,
        kept="--kept" in sys.argv,
        order=next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--order=")), "ab"),
    )
