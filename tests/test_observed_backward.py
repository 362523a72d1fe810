"""backward() out of the rewrite's reach (`runtime.observe`): in a step closure made before the
cell (dvgodoy/PyTorchStepByStep's `make_train_step_fn`) or in a function of an imported module
(`engine.train_one_epoch`), its loss is now seen: the display's curve, the run record's, and a
sweep monitoring the loss. Trained for real on the CPU, bit-identical to the plain cell; a run
whose backward() calls are routed does not wrap `Tensor.backward`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from jupyter_trainmate import last_run, last_sweep

from .test_loop_shapes_step_closures import FACTORY
from .train_harness import COMMON, assert_parity, fresh_shell

CLOSURE_LOOP = """
losses = []
for epoch in range(3):
    losses.append(mini_batch(device, loader, train_step_fn))
"""

ENGINE = '''
def train_one_epoch(model, loader, loss_fn, optimizer):
    """A training function of a module beside the notebook: no rewrite reaches it."""
    total = 0.0
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)
'''

ORIGINAL = torch.Tensor.backward  # as torch defines it

IMPORTED_LOOP = """
for epoch in range(2):
    engine.train_one_epoch(model, loader, loss_fn, opt)
"""


def _record() -> dict[str, object]:
    lines = Path("runs/runs.jsonl").read_text().splitlines()
    record: dict[str, object] = json.loads(lines[-1])
    return record


def test_a_step_closures_loss_is_seen_and_the_weights_are_the_plain_runs() -> None:
    summary, _ = assert_parity([COMMON, FACTORY, CLOSURE_LOOP], "--display off")
    assert (summary.steps, summary.epochs) == (24, 3)
    curve = _record()["curves"]["loss"]  # type: ignore[index]
    assert len(curve) >= 3  # a point at each epoch's end at least
    assert all(0 < value < 2 for _, value in curve)
    assert torch.Tensor.backward is ORIGINAL  # put back


def test_a_loss_in_an_imported_modules_function_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "observed_engine.py").write_text(ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))  # an absolute entry, taken out after the test
    monkeypatch.delitem(sys.modules, "observed_engine", raising=False)  # and the module too
    setup = "import observed_engine as engine"
    summary, _ = assert_parity([COMMON, setup, IMPORTED_LOOP], "--display off")
    sys.modules.pop("observed_engine", None)
    assert summary.optimizer_steps == 16  # the optimizer hook counts its steps, as before
    # The epochs are not counted (the rewrite does not know that the imported function trains):
    # the curve has the run's last loss, where it had none (and, on a machine slow enough for
    # the run to last past the display thread's first reading, 4 a second, readings before it).
    curve = _record()["curves"]["loss"]  # type: ignore[index]
    assert curve[-1][0] == 16
    assert all(0 < value < 2 for _, value in curve)
    assert torch.Tensor.backward is ORIGINAL


def test_a_sweep_monitoring_the_loss_of_a_step_closure_completes_its_trials() -> None:
    """Before, each trial failed: "no training loss seen"."""
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(FACTORY).raise_error()
    cell = """
import jupyter_trainmate
lr = jupyter_trainmate.suggest("lr", 1e-3, 0.3, log=True)
for g in opt.param_groups:
    g["lr"] = lr
for epoch in range(2):
    mini_batch(device, loader, train_step_fn)
"""
    ip.run_cell(
        "%%train --sweep 3 --monitor loss --mode min --sampler random --seed 0 --prune none "
        "--display off "
        f"--tensorboard off\n{cell}"
    ).raise_error()
    sweep = last_sweep()
    assert sweep is not None
    assert [t.state for t in sweep.trials] == ["complete"] * 3
    assert all(t.value is not None and 0 < t.value < 2 for t in sweep.trials)


def test_a_run_whose_backward_is_routed_leaves_tensor_backward_alone() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON + "\nORIGINAL = torch.Tensor.backward\nseen = []").raise_error()
    ip.run_cell("""%%train --display off
for xb, yb in loader:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
    seen.append(torch.Tensor.backward is ORIGINAL)
""").raise_error()
    assert ip.user_ns["seen"] == [True] * 8


def test_tensor_backward_is_put_back_after_a_failing_run() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(FACTORY).raise_error()
    result = ip.run_cell(f"%%train --display off\n{CLOSURE_LOOP}\n    raise ValueError('bad')")
    assert isinstance(result.error_in_exec, ValueError)
    assert torch.Tensor.backward is ORIGINAL
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "failed"


def test_backward_on_another_thread_is_not_counted() -> None:
    import threading

    from jupyter_trainmate.runtime.observe import observe_backwards

    seen: list[torch.Tensor] = []
    undo = observe_backwards(seen.append)
    try:
        w = torch.ones(2, requires_grad=True)
        (w * 2).sum().backward()
        other = threading.Thread(target=lambda: (w * 3).sum().backward())
        other.start()
        other.join()
    finally:
        undo()
    assert len(seen) == 1
    assert torch.Tensor.backward is ORIGINAL
    (w * 4).sum().backward()  # undone: nothing is reported any more
    assert len(seen) == 1


def test_the_options_that_cannot_apply_to_an_observed_backward_are_said_once() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(FACTORY).raise_error()
    ip.run_cell(f"%%train --display off --on-nan stop\n{CLOSURE_LOOP}").raise_error()
    summary = last_run()
    assert summary is not None
    said = [e for e in summary.events if "does not rewrite" in e]
    assert len(said) == 1
    assert "--on-nan stop cannot apply to it" in said[0]
    ip.run_cell(f"%%train --display off\n{CLOSURE_LOOP}").raise_error()
    summary = last_run()
    assert summary is not None
    assert summary.events == ()  # nothing asked that cannot apply


def test_show_says_when_backward_is_observed(capsys: pytest.CaptureFixture[str]) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(FACTORY).raise_error()
    capsys.readouterr()
    ip.run_cell(f"%%train --show\n{CLOSURE_LOOP}").raise_error()
    assert "torch.Tensor.backward reports each call's loss" in capsys.readouterr().out
    ip.run_cell("%%train --show\nloss_fn(model(x), y).backward()\nopt.step()").raise_error()
    assert "torch.Tensor.backward reports" not in capsys.readouterr().out
