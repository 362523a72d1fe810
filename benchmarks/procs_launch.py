"""Launch time of `%%train --procs 2` on the CPU against `torchrun`, and samples/s from 1 to 2 ranks.

Launch: the same 2-rank gloo training of a small MLP (4 steps a rank, so the time is the launch:
spawning or forking, imports, rendezvous, sending the state, bringing it back), run as a
`%%train --procs 2` cell in an IPython shell and as a hand-written DDP script under `torchrun
--standalone --nproc-per-node 2` in a subprocess (what `!torchrun` in a notebook does). Each
`%%train` measurement is a fresh Python process (`python -c`, like a kernel started with `-m`:
no main module for spawned workers to re-import) that runs the cell twice: the first launch of a
kernel and a repeat. With `--before DIR` (a checkout of the code to compare, e.g. from `git
archive`) the rounds alternate DIR's package and this checkout's, then torchrun.

Scaling: a compute-bound MLP (1024 wide, batch 256 a rank) trained for `--steps` steps a rank with
`--procs 1` and `--procs 2` in alternating rounds, one torch thread per worker
(OMP_NUM_THREADS=1): samples/s over rank 0's loop (the launch is not in it) and the CPU time of
rank 0's process per sample it trained (`time.process_time()`, every thread: gloo's too).

    python benchmarks/procs_launch.py [--repeats 3] [--before DIR] [--steps 40] [--only scaling]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMALL = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x, y = torch.randn(64, 32), torch.randn(64, 1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(x, y), batch_size=8)
loss_fn = nn.MSELoss()
"""
LOOP = """
for xb, yb in loader:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
"""
TORCHRUN = """
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
dist.init_process_group("gloo")
torch.manual_seed(0)
x, y = torch.randn(64, 32), torch.randn(64, 1)
model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(x, y)
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
loss_fn = nn.MSELoss()
for xb, yb in loader:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
if dist.get_rank() == 0:
    torch.save(model.module.state_dict(), "trained.pt")
dist.destroy_process_group()
"""
BIG = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x, y = torch.randn(256 * STEPS * 2, 512), torch.randn(256 * STEPS * 2, 1)
model = nn.Sequential(
    nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1)
)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
loader = DataLoader(TensorDataset(x, y), batch_size=256)
loss_fn = nn.MSELoss()
"""


def shell(setup: str) -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(setup).raise_error()
    return ip


def child(launches: int) -> None:
    """In a fresh process: `launches` `%%train --procs 2` runs of the small cell in one shell,
    their wall times as JSON on the last line."""
    ip = shell(SMALL)
    times = []
    for _ in range(launches):
        start = time.perf_counter()
        ip.run_cell("%%train --procs 2 --backend gloo --display off\n" + LOOP).raise_error()
        times.append(time.perf_counter() - start)
    print(json.dumps(times))


def procs_launch(package: Path | None, folder: Path) -> list[float]:
    """First and repeated launch in a fresh process importing jupyter_trainmate from
    `package` (None: this checkout's, as installed or on PYTHONPATH)."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(package), env.get("PYTHONPATH", "")])
    here = str(Path(__file__).parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import procs_launch; procs_launch.child(2)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, check=True, capture_output=True
    )
    times: list[float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return times


def torchrun_launch(folder: Path) -> float:
    script = folder / "ddp_script.py"
    script.write_text(TORCHRUN)
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
        ],
        cwd=folder,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


SCALING = """%%train --procs {procs} --backend gloo --display off
import time
t0, c0 = time.perf_counter(), time.process_time()
seen = 0
for i, (xb, yb) in enumerate(loader):
    if i == STEPS:
        break
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
    seen += len(xb)
wall = time.perf_counter() - t0
cpu = time.process_time() - c0
"""


def scaling_round(ip: Any, procs: int) -> tuple[float, float]:
    """samples/s of all ranks over rank 0's loop, and rank 0's CPU ms per sample it trained."""
    ip.run_cell(SCALING.format(procs=procs)).raise_error()
    ns = ip.user_ns
    return ns["seen"] * procs / ns["wall"], 1000 * ns["cpu"] / ns["seen"]


def median(values: list[float]) -> float:
    return statistics.median(values)


def launch(args: argparse.Namespace, tmp: Path) -> None:
    before = Path(args.before).resolve() if args.before else None
    rows: dict[str, list[float]] = {}
    for round_ in range(args.repeats):  # interleaved: the machine's load changes over time
        sides = [("before", before), ("after", None)] if before else [("procs", None)]
        if round_ % 2:
            sides.reverse()
        for name, package in sides:
            first, again = procs_launch(package, tmp)
            rows.setdefault(f"{name}: first launch", []).append(first)
            rows.setdefault(f"{name}: repeat launch", []).append(again)
        rows.setdefault("torchrun (subprocess)", []).append(torchrun_launch(tmp))
        print(f"round {round_ + 1}, load {os.getloadavg()[0]:.1f}", flush=True)
    for name, values in rows.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:28} median {median(values):5.1f} s  ({shown})")


def scaling(args: argparse.Namespace) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the workers
    ip = shell(f"STEPS = {args.steps}\n" + BIG)
    ip.run_cell("torch.set_num_threads(1)").raise_error()
    found: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    for round_ in range(args.repeats):
        for procs in (1, 2) if round_ % 2 == 0 else (2, 1):
            found[procs].append(scaling_round(ip, procs))
        print(f"round {round_ + 1}, load {os.getloadavg()[0]:.1f}", flush=True)
    for procs, values in found.items():
        rates = ", ".join(f"{r:,.0f}" for r, _ in values)
        cpu = ", ".join(f"{c:.3f}" for _, c in values)
        print(
            f"--procs {procs}: samples/s median {median([r for r, _ in values]):,.0f} ({rates}); "
            f"CPU ms/sample median {median([c for _, c in values]):.3f} ({cpu})"
        )
    one, two = (median([r for r, _ in found[p]]) for p in (1, 2))
    print(f"samples/s 1 -> 2: {two / one:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--before", help="a checkout whose package to compare (launch)")
    parser.add_argument("--only", choices=("launch", "scaling"))
    args = parser.parse_args()
    print(f"cores usable: {len(os.sched_getaffinity(0))}, load before: {os.getloadavg()}")
    home = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # run records land there
        try:
            if args.only in (None, "launch"):
                launch(args, Path(tmp))
            if args.only in (None, "scaling"):
                scaling(args)
        finally:
            os.chdir(home)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
