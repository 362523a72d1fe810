"""The fixed cost of one `%%train` run, part by part (what a run pays besides its steps).

The train_overhead cell with one epoch of one batch, under `%%train` (default options: in
this terminal shell the text view) in one IPython shell, alternating with the plain cell, many times; each setup/teardown part of `runner.run_cell` (and the
magic's own work around it) is wrapped by a timer (wall time, `time.perf_counter`; the parts run
on the training thread one after another). Printed: the median per run of each part, the whole
`%%train` cell and the plain cell (the same loop without `%%train`), in microseconds.

    python benchmarks/run_fixed_cost.py [RUNS]
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
batches = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(1)]
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
"""
LOOP = """
for epoch in range(1):
    for xb, yb in batches:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
"""

_spent: dict[str, float] = defaultdict(float)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _spent[name] += time.perf_counter() - started

    return wrapper


def _wrap(owner: Any, attr: str, name: str) -> None:
    setattr(owner, attr, _timed(name, getattr(owner, attr)))


def instrument() -> None:
    """Wrap each part where `runner.run_cell` and the magic look it up."""
    import jupyter_trainmate.cell as cell
    import jupyter_trainmate.rewrite as rewrite
    import jupyter_trainmate.runner as runner
    import jupyter_trainmate.runtime.options as options
    from jupyter_trainmate.display.live import LiveDisplay
    from jupyter_trainmate.runtime.session import TrainSession
    from jupyter_trainmate.runtime.status import StatusWriter
    from jupyter_trainmate.runtime.tensorboard import TensorBoardLog

    _wrap(options, "parse_options", "magic: parse options")
    _wrap(cell, "register_cell", "magic: register cell")
    _wrap(rewrite, "rewrite_cell", "rewrite (cached)")
    _wrap(runner, "run_cell", "run_cell (whole)")
    _wrap(runner, "compile_rewritten", "compile rewritten cell")
    _wrap(runner, "wanted", "tensorboard wanted()")
    _wrap(runner, "TrainSession", "session: create")
    _wrap(TrainSession, "start", "session: start")
    _wrap(runner._Run, "close", "session: close + summary")
    _wrap(runner, "_install", "install session/functions")
    _wrap(runner, "StatusWriter", "status: create")
    _wrap(StatusWriter, "start", "status: start (first write)")
    _wrap(StatusWriter, "stop", "status: stop (unlink)")
    _wrap(runner, "TensorBoardLog", "tensorboard: create")
    _wrap(runner._Run, "close_tensorboard", "tensorboard: close")
    _wrap(runner, "LiveDisplay", "display: create")
    _wrap(LiveDisplay, "start", "display: thread start")
    _wrap(LiveDisplay, "halt", "display: thread stop")
    _wrap(runner._Run, "finish_display", "display: final drawing")
    _wrap(runner, "_write_run_record", "run record")
    _ = TensorBoardLog  # imported so its module is loaded before timing


def main(runs: int = 200) -> dict[str, float]:
    torch.set_num_threads(1)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    instrument()
    cells = {"plain cell": LOOP, "%%train cell": "%%train\n" + LOOP}
    per_run: dict[str, list[float]] = defaultdict(list)
    for _ in range(3):  # warm-up: first-run imports, the rewrite cache
        for cell in cells.values():
            ip.run_cell(cell, silent=True).raise_error()
    for _ in range(runs):
        for name, cell in cells.items():
            _spent.clear()
            started = time.perf_counter()
            ip.run_cell(cell, silent=True).raise_error()
            elapsed = time.perf_counter() - started
            if name == "%%train cell":
                for part, spent in _spent.items():
                    per_run[part].append(spent)
            per_run[name].append(elapsed)
    medians = {part: statistics.median(values) for part, values in per_run.items()}
    width = max(map(len, medians))
    for part, value in medians.items():
        print(f"{part:<{width}}  {value * 1e6:8.0f} us")
    return medians


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:2]])
