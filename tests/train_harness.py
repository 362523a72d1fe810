"""Run a cell plainly and under `%%train` in fresh IPython shells; compare the weights bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import RunSummary, last_run
from jupyter_trainmate.runtime.status import StatusWriter

COMMON = """
import random
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
random.seed(0)
torch.manual_seed(0)
x = torch.randn(256, 8)
y = (x[:, :4].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
"""

# A GPU that cannot hold more than 16 samples, on the CPU: a forward hook raises the error CUDA
# raises for bigger batches (the retry point splits them in micro-batches of 16).
REFUSE_BIG_BATCHES = """
failures = []
def refuse(module, inputs):
    if inputs[0].shape[0] > 16:
        failures.append(inputs[0].shape[0])
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
model[0].register_forward_pre_hook(refuse)
"""


def stopping_step(indent: int) -> str:
    """A training step on `xb, yb` that counts itself in `k` and raises KeyboardInterrupt when
    `k` reaches STOP, between backward() and the optimizer step (`interrupt_then_resume`), as
    lines indented by `indent` spaces."""
    lines = [
        "k += 1",
        "opt.zero_grad()",
        "loss_fn(model(xb), yb).backward()",
        "if k == STOP:",
        "    raise KeyboardInterrupt",
        "opt.step()",
    ]
    return "".join(" " * indent + line + "\n" for line in lines)


def fresh_shell() -> InteractiveShell:
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    return ip


def weights(ip: InteractiveShell) -> dict[str, torch.Tensor]:
    found = {}
    for name, value in ip.user_ns.items():
        if isinstance(value, torch.nn.Module) and not name.startswith("_"):
            for key, tensor in value.state_dict().items():
                found[f"{name}.{key}"] = tensor.detach().clone()
    return found


def run(cells: list[str], line: str | None) -> InteractiveShell:
    """Run every cell; the last one plainly (line None) or under `%%train LINE`."""
    ip = fresh_shell()
    *setup, loop = cells
    for cell in setup:
        ip.run_cell(cell).raise_error()
    ip.run_cell(loop if line is None else f"%%train {line}\n{loop}").raise_error()
    return ip


def assert_parity(cells: list[str], line: str = "") -> tuple[RunSummary, InteractiveShell]:
    """The cell under `%%train LINE` ends with the same weights as the plain cell, bit for bit."""
    plain = weights(run(cells, None))
    ip = run(cells, line)
    trained = weights(ip)
    assert plain, "no model found to compare"
    assert plain.keys() == trained.keys()
    differing = [k for k in plain if not torch.equal(plain[k], trained[k])]
    assert not differing, f"weights differ from the plain run: {differing}"
    assert "__trainmate__" not in ip.user_ns
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    return summary, ip


def assert_retried_as_micro_batches(ip: InteractiveShell) -> None:
    """A run over REFUSE_BIG_BATCHES: its one failed batch of 32 was redone as 2 micro-batches
    of 16 and the split kept (one failure, 16 optimizer steps in 2 epochs of 8 batches)."""
    assert ip.user_ns["failures"] == [32]
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    assert summary.optimizer_steps == 16
    assert any("the batch of 32 now runs as 2 micro-batches of 16" in e for e in summary.events)


def status_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run name of every status file write from now on (each write still happens)."""
    writes: list[str] = []
    real_write = StatusWriter.write

    def counted(self: StatusWriter) -> None:
        writes.append(str(self._identity["run_name"]))
        real_write(self)

    monkeypatch.setattr(StatusWriter, "write", counted)
    return writes


def interrupt_then_resume(
    cells: list[str],
    loop: str,
    folder: Path,
    between: Callable[[dict[str, Any]], object] = lambda namespace: None,
    *,
    resume: bool = True,
    stop: int = 6,
    events: list[str] | None = None,
) -> InteractiveShell:
    """Run `loop` under `%%train --checkpoint FOLDER` with STOP = `stop` (the cell raises
    KeyboardInterrupt there), call `between` with the namespace, then run it again with
    STOP = -1 and `--resume` (unless `resume` is false); the shell after. `events` gets the
    interrupted run's events."""
    ip = fresh_shell()
    for source in cells:
        ip.run_cell(source).raise_error()
    ip.user_ns["STOP"] = stop
    line = f"--checkpoint {folder} --display off"
    ip.run_cell(f"%%train {line}\n{loop}")
    interrupted = last_run()
    assert interrupted is not None
    assert interrupted.outcome == "interrupted"
    if events is not None:
        events.extend(interrupted.events)
    between(ip.user_ns)
    if resume:
        ip.user_ns["STOP"] = -1
        ip.run_cell(f"%%train {line} --resume\n{loop}").raise_error()
    return ip
