"""onnxruntime on the CPU provider: `InferenceSession.run` against I/O binding (`deploy/binding.py`).

The 64-256-256-10 MLP of `bench_spread.py`, exported once, batch sizes 1, 32 and 256, one thread.
Both ways are timed in the same process with the bench's own method (`measure_rounds`: the
configurations interleaved in rounds), on the wall clock and on the thread's CPU clock; the
figure is plain / bound at p50 (above 1: binding is faster). Repeated `--repeats` times.

    python benchmarks/ort_binding.py [--repeats 3] [--min-run-time 1.0] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from jupyter_trainmate.deploy.binding import Bound
from jupyter_trainmate.deploy.export import export
from jupyter_trainmate.deploy.inputs import make_example
from jupyter_trainmate.deploy.measure import measure_rounds
from jupyter_trainmate.deploy.parity import feeds, session

SIZES = (1, 32, 256)


class Row:
    def __init__(self, call: Callable[[], None], batch: int) -> None:
        self.call = call
        self.batch = batch

    def context(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    example = make_example(model, torch.randn(1, 64))
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "mlp.onnx"
        export(model, example, path, batch_sizes=())
        sess = session(path, threads=1)
        names = [o.name for o in sess.get_outputs()]
        rows: list[Row] = []
        for size in SIZES:
            fed = feeds(sess, example.repeated(size))
            rows.append(Row(lambda fed=fed: sess.run(names, fed), size))  # type: ignore[misc]
            rows.append(Row(Bound(sess, fed).run, size))
        print("| clock | repeat | batch | run() p50 ms | bound p50 ms | run() / bound |")
        print("|---|---|---|---|---|---|")
        for clock in ("wall", "cpu"):
            for repeat in range(args.repeats):
                timed = measure_rounds(rows, args.min_run_time, args.rounds, 1, clock, None)
                for i, size in enumerate(SIZES):
                    plain, bound = timed[2 * i][0].p50_ms, timed[2 * i + 1][0].p50_ms
                    print(
                        f"| {clock} | {repeat + 1} | {size} | {plain:.4g} | {bound:.4g} "
                        f"| {plain / bound:.3f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
