"""Run-to-run spread of `jupyter_trainmate.bench()` at p50: the same bench in separate processes.

A 64-256-256-10 MLP (float32, eval), batch sizes 1 and 32, eager / torch.compile / onnxruntime,
one thread (`--threads N` to change), `min_run_time` 1 s per row, the rows interleaved in
`--rounds` rounds (1: each row timed alone, back to back, the method before rounds), on the
`--clock` (wall, or cpu: the calling thread's CPU time). Each run is a fresh Python process
(imports, export, compile and all), as a user would rerun the command. Prints each run's p50 per
row and the spread between runs: (max - min) / min of the p50s. Goal: under 5%.

    python benchmarks/bench_spread.py [--runs 3] [--threads 1] [--min-run-time 1.0]
        [--rounds 5] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ONE_RUN = """
import json, sys, torch
from torch import nn
import jupyter_trainmate
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
report = jupyter_trainmate.bench(
    model, torch.randn(1, 64), batch_sizes=(1, 32), precision=("fp32",),
    min_run_time=float(sys.argv[2]), threads=int(sys.argv[1]),
    rounds=int(sys.argv[3]), clock=sys.argv[4], record=False,
)
print(json.dumps([[r.backend, r.batch_size, r.p50_ms, r.recompiles] for r in report.rows]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                ONE_RUN,
                str(args.threads),
                str(args.min_run_time),
                str(args.rounds),
                args.clock,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"run {i + 1} done", file=sys.stderr, flush=True)
    header = " | ".join(f"run {i + 1} p50 ms" for i in range(args.runs))
    print(f"| backend | batch | {header} | spread | recompiles |")
    print("|---|---|" + "---|" * args.runs + "---|---|")
    worst = 0.0
    for rows in zip(*runs, strict=True):
        backend, batch = rows[0][0], rows[0][1]
        p50s = [row[2] for row in rows]
        spread = (max(p50s) - min(p50s)) / min(p50s)
        worst = max(worst, spread)
        cells = " | ".join(f"{p:.4g}" for p in p50s)
        recompiles = ", ".join(str(row[3]) for row in rows) if rows[0][3] is not None else ""
        print(f"| {backend} | {batch} | {cells} | {spread:.1%} | {recompiles} |")
    print(
        f"\nworst spread: {worst:.1%} ({args.threads} thread(s), {args.runs} runs, "
        f"{args.rounds} round(s), {args.clock} clock)"
    )


if __name__ == "__main__":
    main()
