"""What the live display costs the training loop, measured in a real kernel.

1. Overhead with the widget on: the tiny-MLP cell of train_overhead.py (5000 steps, ~1.4 s, so
   the per-run cost of creating the widget weighs as little as in a real run) in an ipykernel
   started here (jupyter_client), plainly, under `%%train --display widget` and under
   `--display text`, alternating; timed inside the kernel; median of per-pair ratios.
2. The display thread's CPU: the one thread a run starts (NVML and host readings and the status
   file once a second, the run state 4 times a second) running for 20 s; the thread's own CPU
   time from psutil, per wall second.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch
from jupyter_client.manager import start_new_kernel

from jupyter_trainmate.display.live import LiveDisplay
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.runtime.session import TrainSession
from jupyter_trainmate.runtime.status import StatusWriter

SETUP = """
import time, torch, json
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
batches = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(100)]
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
%load_ext jupyter_trainmate
times = {}
"""
LOOP = """
for epoch in range(50):
    for xb, yb in batches:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
"""
MODES = {"plain": "", "widget": "%%train --display widget\n", "text": "%%train --display text\n"}


def timed_cell(mode: str) -> str:
    # the magic line must come first, so the time is taken by a cell before and one after
    return MODES[mode] + LOOP


def kernel_overhead(repeats: int = 7) -> dict[str, float]:
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute_interactive(SETUP, timeout=120, output_hook=lambda msg: None)
        results: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(repeats + 1):
            for mode in MODES:
                kc.execute_interactive("_t0 = time.perf_counter()", timeout=60)
                kc.execute_interactive(timed_cell(mode), timeout=300, output_hook=lambda msg: None)
                out: list[str] = []
                kc.execute_interactive(
                    "print(time.perf_counter() - _t0)",
                    timeout=60,
                    output_hook=lambda msg, out=out: out.append(msg["content"].get("text", "")),
                )
                results[mode].append(float("".join(out).strip().splitlines()[-1]))
        ratios = {
            mode: statistics.median(
                t / p for p, t in zip(results["plain"][1:], results[mode][1:], strict=True)
            )
            for mode in ("widget", "text")
        }
        plain_us = statistics.median(results["plain"][1:]) / 5000 * 1e6
        print(
            f"in a kernel, 5000-step runs, median of {repeats} pairs: plain {plain_us:.0f} us/step; "
            f"%%train --display widget {ratios['widget']:.3f}, --display text {ratios['text']:.3f}"
        )
        return ratios
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def display_thread_cpu(seconds: float = 20.0) -> float:
    """CPU of the run's one display thread (readings, status file, state) while a run waits."""
    model = torch.nn.Linear(2, 2)
    namespace = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    session = TrainSession(TrainOptions(display="text"), namespace)
    session.start()
    with tempfile.TemporaryDirectory() as tmp:
        status = StatusWriter(
            session.progress, notebook=None, run_name="bench", directory=Path(tmp)
        )
        status.start()
        live = LiveDisplay(session, "text", status=status)
        live.view = None  # no redraws: the text view prints only every 10 s anyway
        live.start()
        native = live._thread.native_id
        process = psutil.Process()

        def thread_cpu() -> float:
            for t in process.threads():
                if t.id == native:
                    return float(t.user_time + t.system_time)
            return 0.0

        before, started = thread_cpu(), time.perf_counter()
        time.sleep(seconds)
        used, wall = thread_cpu() - before, time.perf_counter() - started
        samples = live.sampler.samples
        live.halt()
        status.stop()
    session.close("finished")
    share = used / wall
    print(
        f"display thread: {used * 1000:.0f} ms of CPU in {wall:.1f} s = {share * 100:.3f}% of a core "
        f"({samples} device readings and status writes, state refreshed 4 times a second)"
    )
    return share


if __name__ == "__main__":
    assert threading.current_thread() is threading.main_thread()
    kernel_overhead()
    display_thread_cpu()
