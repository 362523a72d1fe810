"""`%%train --sweep` on the training loops of public notebooks, their code unchanged.

    python benchmarks/sweep_corpus.py FOLDER [--only NAME] [--trials 3]

FOLDER holds the notebooks of `loops_corpus.toml` (see `loops_corpus.py`: the same programs, the
same synthetic data). Each training cell runs as `%%train --sweep N --monitor loss --space
"lr=..."`: no `suggest()` and no `log()` in the cell, so this is the search a user gets on the
loop the notebook already has. Per notebook: the trials' states and values, whether each trial
started from the same weights (the `--space` snapshot), and the error of a search that could not
start (one line, as the user sees it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from loops_corpus import fresh_shell, load, program

import jupyter_trainmate


def sweep(setup: list[str], train: str, trials: int) -> tuple[str, list[str], float]:
    """The search's outcome: ('ok' or the first error line, trials as 'state value', seconds)."""
    ip = fresh_shell()
    with contextlib.redirect_stdout(io.StringIO()):
        for source in setup:
            ip.run_cell(source).raise_error()
    line = (
        f'--sweep {trials} --monitor loss --space "lr=1e-4..1e-1:log" --seed 0 '
        "--prune none --display off --tensorboard off"
    )
    started = time.perf_counter()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        result = ip.run_cell(f"%%train {line}\n{train}")
    seconds = time.perf_counter() - started
    error = result.error_in_exec or result.error_before_exec
    summary = jupyter_trainmate.last_sweep()
    shown = [
        f"{t.state} {t.value:.4g}" if t.value is not None and math.isfinite(t.value)
        else f"{t.state} ({t.reason})"
        for t in (summary.trials if summary is not None else ())
    ]  # fmt: skip
    if error is not None:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}", shown, seconds
    return "ok", shown, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("folder", type=Path)
    parser.add_argument(
        "--manifest", type=Path, default=Path(__file__).with_name("loops_corpus.toml")
    )
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    folder = args.folder.resolve()
    entries = [e for e in load(args.manifest) if not args.only or e.name in args.only]
    rows = []
    home = Path.cwd()
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)  # runs/optuna.journal and the run records land here
        for entry in entries:
            if not (folder / entry.file).exists():
                rows.append((entry.name, "missing", [], 0.0))
                continue
            setup, train = program(entry, folder)
            outcome, trials, seconds = sweep(setup, train, args.trials)
            rows.append((entry.name, outcome, trials, seconds))
            print(f"== {entry.name}: {outcome}; {', '.join(trials)} ({seconds:.1f} s)", flush=True)
        os.chdir(home)
    complete = sum(
        1 for _, outcome, trials, _ in rows
        if outcome == "ok" and trials and all(t.startswith("complete") for t in trials)
    )  # fmt: skip
    print(f"\n{complete}/{len(rows)} searches with every trial complete")
    for name, outcome, trials, _ in rows:
        print(f"{name:32s} {outcome if outcome != 'ok' else ', '.join(trials)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
