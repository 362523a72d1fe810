"""What `%%train --sweep` adds to each trial over a hand-written Optuna objective, in
instructions counted by callgrind: `sweep_overhead.py`'s figure without the machine's noise.

`sweep_overhead.py` times the two sides in wall time. On this project's shared 2-core machines its
median of 25 pairs reads anywhere from 1.01 to 1.11 from one run to the next with the same code
(each pair's ratio from 0.8 to 1.35), and swapping which side runs first in a pair moves it no
more than that (BENCHMARKS.md): the 2-5 points a trial costs cannot be read from one run. As
`step_instructions.py` does for a `%%train` run, this script runs the same two sweeps (the same
cell, loop, study settings and journal file as `sweep_overhead.py`) under callgrind with the
instrumentation on only around each measured cell, at two lengths (1 and 4 trials, 3 times each),
and prints, on the thread the trials run on:

- per trial: the instructions of a trial of each side (the slope) and their ratio, the figure
  issue 15's goal (<= 1.05) is about;
- per sweep: the extra instructions of a sweep's set-up and end (the intercept).

The clocks that adapt to the speed are pinned as in `step_instructions.py` (the step timer's
stride, the display's refresh slowed by valgrind's measured slowdown). Instructions are not
time: the syscalls of the files a trial writes (the journal's records on both sides; the run
record and the event file of a `%%train` trial) cost more than their instructions here.

    python benchmarks/sweep_instructions.py   # runs itself under valgrind (about 5 minutes)

Needs `valgrind` and its headers (Debian `valgrind`) and `gcc`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from step_instructions import STRIDE, slow_clocks, under_callgrind
from sweep_overhead import HAND, LOOP, SETUP

LENGTHS = (1, 4)  # trials per sweep
REPEATS = 3
EPOCHS, STEPS = 4, 50


def cells() -> tuple[str, str, str, str]:
    """(setup, the hand-written side's definitions, its sweep's call, the `%%train` cell), as
    `sweep_overhead.py` runs them (default options, the journal kept by both sides)."""
    loop = LOOP.replace("EPOCHS", str(EPOCHS))
    body = "\n".join("    " + line for line in loop.strip().splitlines())
    hand = HAND.replace("BODY", body).replace("KEEP:", "True:")
    train = (
        "%%train --sweep TRIALS --monitor val_loss --sampler random --seed 0 --prune none\n"
        'LR = jupyter_trainmate.suggest("lr", 1e-3, 0.3, log=True)\n'
        + loop.replace("REPORT(", "jupyter_trainmate.log(")
    )
    return SETUP.replace("STEPS", str(STEPS)), hand, "hand_sweep('NAME', TRIALS)", train


def shell() -> object:
    import optuna
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    torch.set_num_threads(1)
    os.chdir(tempfile.mkdtemp(prefix="sweep-instructions-"))
    Path("runs").mkdir()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    setup, hand, _, _ = cells()
    ip.run_cell(setup).raise_error()
    ip.run_cell(hand).raise_error()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return ip


def native_seconds() -> float:
    """A hand-written sweep of 2 trials at full speed (median of 5, this process)."""
    ip = shell()
    _, _, call, _ = cells()
    times = []
    for i in range(6):
        started = time.perf_counter()
        ip.run_cell(call.replace("NAME", f"n{i}").replace("TRIALS", "2")).raise_error()  # type: ignore[attr-defined]
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[2]


def child(helper: Path, native: float) -> None:
    """Under valgrind: the sweeps, each measured one between `start` and `stop`."""
    import ctypes
    import gc

    lib = ctypes.CDLL(str(helper))
    lib.stop.argtypes = [ctypes.c_char_p]
    if not lib.running():
        raise SystemExit("sweep_instructions: the child is not running under valgrind")
    ip = shell()
    _, _, call, train = cells()
    ip.run_cell(call.replace("NAME", "warm").replace("TRIALS", "2")).raise_error()  # type: ignore[attr-defined]
    lib.start()  # how much slower an instrumented sweep is than the same sweep at full speed
    started = time.perf_counter()
    ip.run_cell(call.replace("NAME", "calibration").replace("TRIALS", "2")).raise_error()  # type: ignore[attr-defined]
    factor = (time.perf_counter() - started) / native
    lib.stop(b"calibration")
    print(f"under callgrind: {factor:.0f} times slower; one step in {STRIDE} timed")
    slow_clocks(factor, STRIDE)
    for warm in range(2):  # the rewrite cache, first-call paths, both sides
        ip.run_cell(train.replace("TRIALS", "1")).raise_error()  # type: ignore[attr-defined]
        ip.run_cell(call.replace("NAME", f"w{warm}").replace("TRIALS", "1")).raise_error()  # type: ignore[attr-defined]
    for trials in LENGTHS:
        for repeat in range(REPEATS):
            for side in ("hand", "train"):
                cell = (
                    call.replace("NAME", f"h{trials}-{repeat}") if side == "hand" else train
                ).replace("TRIALS", str(trials))
                gc.collect()
                lib.start()
                ip.run_cell(cell, silent=True).raise_error()  # type: ignore[attr-defined]
                lib.stop(f"{side}-{trials}-{repeat}".encode())


def main() -> None:
    if shutil.which("valgrind") is None or shutil.which("gcc") is None:
        raise SystemExit("sweep_instructions: needs valgrind and gcc")
    output, found = under_callgrind(__file__, native_seconds())
    print(output)
    rows = {}
    for trials in LENGTHS:
        for side in ("hand", "train"):
            values = sorted(found[f"{side}-{trials}-{r}"][1] for r in range(REPEATS))
            median = values[REPEATS // 2]
            spread = max(abs(v / median - 1) for v in values)
            rows[side, trials] = median
            print(
                f"{side:5s} {trials} trial(s): {median:,} Ir (median of {REPEATS}; every repeat "
                f"within {spread * 100:.3f}%)"
            )
    (a, b) = LENGTHS
    per_trial = {s: (rows[s, b] - rows[s, a]) / (b - a) for s in ("hand", "train")}
    per_sweep = {s: rows[s, a] - per_trial[s] * a for s in ("hand", "train")}
    print(
        f"per trial: hand {per_trial['hand']:,.0f} Ir, %%train {per_trial['train']:,.0f} Ir: "
        f"{per_trial['train'] / per_trial['hand']:.4f} x (goal <= 1.05)"
    )
    print(
        f"per sweep: hand {per_sweep['hand']:,.0f} Ir, %%train {per_sweep['train']:,.0f} Ir "
        f"(+{(per_sweep['train'] - per_sweep['hand']) / per_trial['hand']:.2f} trials' worth)"
    )
    for trials in (8, 20):
        hand = per_sweep["hand"] + per_trial["hand"] * trials
        train = per_sweep["train"] + per_trial["train"] * trials
        print(f"a sweep of {trials} trials: {train / hand:.4f} x the hand-written sweep")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), float(sys.argv[3]))
    else:
        main()
