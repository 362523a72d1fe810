"""The CUDA paths of `%%train`, checked and timed in one script (under 8 minutes on one GPU).

Run it on a machine with a CUDA GPU: `python benchmarks/gpu_suite.py`. It prints a table:
1. AMP: a matmul-heavy MLP (8 x 4096-wide layers, batch 1024, labels from a random linear
   teacher) trained with `--amp off`, `--amp bf16` (where supported) and `--amp fp16` from the
   same seed; speed-up against fp32 and the mean loss of the last epoch (within 10% of fp32's).
2. Prefetch: an input-bound loop (pinned CPU batches copied each step) with `--prefetch off` and
   `--prefetch cuda`: samples/s and the data-wait share.
3. Overhead: a tiny MLP plainly and under `%%train --amp off --prefetch off`, alternating runs.
On a machine without CUDA it says so and exits 0 (nothing to check).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import last_run

AMP_SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
device = torch.device("cuda")
x = torch.randn(24 * 1024, 4096, device=device)
teacher = torch.randn(4096, 16, device=device)
y = (x @ teacher).argmax(1)  # learnable labels: the loss curves of the modes can be compared
batches = [(x[i:i + 1024], y[i:i + 1024]) for i in range(0, len(x), 1024)]
layers = [m for _ in range(8) for m in (nn.Linear(4096, 4096), nn.GELU())]
model = nn.Sequential(*layers, nn.Linear(4096, 16)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss_fn = nn.CrossEntropyLoss()
"""
AMP_LOOP = """
for epoch in range(3):
    losses = []
    for xb, yb in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
final_loss = torch.stack(losses).float().mean().item()  # mean of the last epoch
"""
PREFETCH_SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(256 * 64, 3, 64, 64), torch.randint(0, 10, (256 * 64,)))
loader = DataLoader(data, batch_size=256, pin_memory=True)
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""
PREFETCH_LOOP = """
for xb, yb in loader:
    xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
torch.cuda.synchronize()
"""
TINY_SETUP = """
import torch
from torch import nn
batches = [(torch.randn(64, 64, device="cuda"), torch.randint(0, 10, (64,), device="cuda")) for _ in range(200)]
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""
TINY_LOOP = """
for xb, yb in batches:
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
torch.cuda.synchronize()
"""


def shell(setup: str) -> InteractiveShell:
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(setup).raise_error()
    return ip


def timed(ip: InteractiveShell, cell: str) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    ip.run_cell(cell, silent=True).raise_error()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def amp_rows() -> list[str]:
    rows = []
    modes = ["off", "fp16"] + (["bf16"] if torch.cuda.is_bf16_supported() else [])
    results = {}
    for mode in modes:
        ip = shell(AMP_SETUP)
        timed(ip, f"%%train --amp {mode}\n{AMP_LOOP}")  # warm-up (cuBLAS, allocator)
        ip = shell(AMP_SETUP)
        seconds = timed(ip, f"%%train --amp {mode}\n{AMP_LOOP}")
        summary = last_run()
        assert summary is not None
        results[mode] = (seconds, ip.user_ns["final_loss"], summary.skipped_steps)
    base_s, base_loss, _ = results["off"]
    for mode, (seconds, loss, skipped) in results.items():
        ok = abs(loss - base_loss) <= 0.10 * abs(base_loss) + 0.02
        rows.append(
            f"amp {mode:4s}: {seconds:6.2f} s, speed-up {base_s / seconds:4.2f}x vs fp32, final loss "
            f"{loss:.4f} (fp32 {base_loss:.4f}) {'OK' if ok else 'OUT OF TOLERANCE'}, {skipped} skipped"
        )
    return rows


def prefetch_rows() -> list[str]:
    rows = []
    for mode in ("off", "cuda"):
        ip = shell(PREFETCH_SETUP)
        timed(ip, f"%%train --amp off --prefetch {mode}\n{PREFETCH_LOOP}")
        seconds = timed(ip, f"%%train --amp off --prefetch {mode}\n{PREFETCH_LOOP}")
        summary = last_run()
        assert summary is not None
        rows.append(
            f"prefetch {mode:4s}: {summary.samples / seconds:9,.0f} samples/s, data wait "
            f"{summary.data_wait_share:.0%}"
        )
    return rows


def overhead_row(repeats: int = 21) -> str:
    ip = shell(TINY_SETUP)
    cells = {"plain": TINY_LOOP, "train": "%%train --amp off --prefetch off\n" + TINY_LOOP}
    times: dict[str, list[float]] = {k: [] for k in cells}
    for cell in cells.values():
        timed(ip, cell)
    for _ in range(repeats):
        for k, cell in cells.items():
            times[k].append(timed(ip, cell))
    ratio = statistics.median(t / p for p, t in zip(times["plain"], times["train"], strict=True))
    return f"overhead (tiny MLP, 200 steps): ratio {ratio:.3f} (median of {repeats} pairs)"


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_suite: no CUDA GPU here; nothing to check")
        return 0
    print(
        f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    for row in amp_rows() + prefetch_rows() + [overhead_row()]:
        print("  " + row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
