"""A scheduler the training cell makes itself (`scheduler = ReduceLROnPlateau(opt)` in the cell,
as in handson-ml3's and many tutorials' training cells): a resumed run made it anew, after the
checkpoint's state went into the old one, and went on with a fresh scheduler: another learning
rate, other weights, no word said. Now the new one gets the checkpoint's state at the run's first
optimizer step, with its optimizer's settings as the checkpoint has them (a new OneCycleLR resets
the learning rate and the momentum). Interrupted for real and resumed on the CPU, bit-identical
to the uninterrupted plain run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jupyter_trainmate import last_run

from .test_loop_shapes_wave2 import interrupt_then_resume
from .train_harness import COMMON, run, weights

SETUP = COMMON + "\nk = 0\nSTOP = -1\n"

ONE_CYCLE = """
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=24)
for epoch in range(3):
    for xb, yb in loader:
        k += 1
        if k == STOP:
            raise KeyboardInterrupt
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
"""

PLATEAU = """
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
for epoch in range(3):
    for xb, yb in loader:
        k += 1
        if k == STOP:
            raise KeyboardInterrupt
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    sched.step(1.0)  # never better after the first epoch: halved at each epoch's end after it
"""


@pytest.mark.parametrize("loop", [ONE_CYCLE, PLATEAU], ids=["one-cycle", "plateau"])
def test_a_scheduler_made_in_the_cell_resumes_bit_identical(loop: str, tmp_path: Path) -> None:
    expected = weights(run([SETUP, loop], None))
    ip = interrupt_then_resume([SETUP], loop, tmp_path)  # stopped at step 6 of 24
    got = weights(ip)
    assert [name for name in expected if not torch.equal(expected[name], got[name])] == []
    summary = last_run()
    assert summary is not None
    assert any("sched made by the cell" in e for e in summary.events), summary.events


def test_a_scheduler_the_kernel_lost_is_made_by_the_cell_and_resumed(tmp_path: Path) -> None:
    """After a kernel restart the notebook's earlier cells run again, but not the training cell:
    the scheduler the checkpoint holds is not there until the cell makes it."""
    expected = weights(run([SETUP, PLATEAU], None))
    ip = interrupt_then_resume([SETUP], PLATEAU, tmp_path, between=lambda ns: ns.pop("sched"))
    got = weights(ip)
    assert [name for name in expected if not torch.equal(expected[name], got[name])] == []


def test_a_scheduler_of_the_checkpoint_that_never_comes_is_an_error(tmp_path: Path) -> None:
    ip = interrupt_then_resume([SETUP], PLATEAU, tmp_path, resume=False)
    ip.user_ns.pop("sched")
    ip.user_ns["STOP"] = -1
    no_scheduler = PLATEAU.replace("sched = torch", "other = torch").replace("sched.step", "pass #")
    result = ip.run_cell(f"%%train --checkpoint {tmp_path} --display off --resume\n{no_scheduler}")
    assert result.error_in_exec is not None
    assert "the checkpoint has scheduler 'sched', the notebook has none" in str(
        result.error_in_exec
    )


def test_the_names_a_cell_makes_are_its_own_assignments_not_its_loop_targets() -> None:
    from jupyter_trainmate.runner import _cell_assigns

    source = """
model, opt = build()
sched: object = make(opt)
best_model = None
for net in nets:
    inner = net
with context():
    if flag:
        ema = copy(model)
try:
    swa = wrap(model)
except ValueError:
    fallback = model
def helper():
    local = 1
"""
    assert _cell_assigns(source) == {
        "model", "opt", "sched", "best_model", "ema", "swa", "fallback"
    }  # fmt: skip
    assert _cell_assigns("%%bash\necho") == frozenset()
