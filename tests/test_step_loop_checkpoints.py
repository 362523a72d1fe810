"""`--checkpoint` and `--resume` on a loop whose passes are the steps: `for i in range(max_steps):`
drawing its own batch each pass (karpathy's makemore and nanoGPT, zergtant's handbook 3.3,
L1aoXingyu's LSTM time series). Such a loop iterates no batches, so it wrote no checkpoint and a
Ctrl-C lost the run; its passes are now checkpointed (every `--every` steps, at its end, on an
interrupt) and `--resume` skips the ones done. Trained for real on the CPU: the interrupted then
resumed run ends bit-identical to the uninterrupted plain one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import RunSummary, last_run
from jupyter_trainmate.runtime.checkpoint import checkpoints

from .train_harness import COMMON, fresh_shell, run, weights

DRAWS = """
import numpy as np
np.random.seed(0)
X, Y = torch.randn(512, 8), torch.randint(0, 2, (512,))
STOP, WHERE = -1, ""
lossi = []
"""

# A pass draws its batch from torch's generator and a dropout mask (model has Dropout), and
# np.random picks a learning rate scale: every generator moves in every pass.
STEPS = """
for i in range(30):
    ix = torch.randint(0, X.shape[0], (32,))
    loss = loss_fn(model(X[ix]), Y[ix])
    opt.zero_grad()
    loss.backward()
    if i == STOP and WHERE == "before the update":
        raise KeyboardInterrupt
    for group in opt.param_groups:
        group["lr"] = 0.05 * (1 + np.random.rand())
    opt.step()
    lossi.append(loss.item())
    if i == STOP and WHERE == "after the update":
        raise KeyboardInterrupt
"""


def interrupted_then_resumed(
    loop: str, where: str, folder: Path, setup: tuple[str, ...] = (COMMON, DRAWS)
) -> tuple[InteractiveShell, RunSummary, RunSummary]:
    """Run `loop` under `%%train --checkpoint FOLDER` after the `setup` cells, stopped by a
    KeyboardInterrupt where STOP is 12 (`where`: before or after its update), then again with
    `--resume` in the same shell."""
    ip = fresh_shell()
    for cell in setup:
        ip.run_cell(cell).raise_error()
    ip.user_ns.update(STOP=12, WHERE=where)
    line = f"--checkpoint {folder} --display off"
    ip.run_cell(f"%%train {line}\n{loop}")
    interrupted = last_run()
    assert interrupted is not None
    ip.user_ns["STOP"] = -1
    ip.run_cell(f"%%train {line} --resume\n{loop}").raise_error()
    resumed = last_run()
    assert resumed is not None
    return ip, interrupted, resumed


@pytest.mark.parametrize("where", ["before the update", "after the update"])
def test_a_ctrl_c_in_a_step_loop_then_resume_ends_with_the_uninterrupted_weights(
    where: str, tmp_path: Path
) -> None:
    expected = weights(run([COMMON, DRAWS, STEPS], None))
    ip, interrupted, resumed = interrupted_then_resumed(STEPS, where, tmp_path)
    assert interrupted.outcome == "interrupted"
    done = 13 if where == "after the update" else 12  # a pass counts once it updated the weights
    assert any(f"after {done} passes of the training loop" in e for e in interrupted.events)
    # the interrupt's checkpoint counts the steps it holds; the resumed run's end counts on
    assert [p.name for p in checkpoints(tmp_path)] == [f"step-{done:08d}.pt", "step-00000030.pt"]
    assert resumed.optimizer_steps == 30 - done
    assert any(f"resumed after {done} passes" in e for e in resumed.events)
    got = weights(ip)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []


def test_a_step_loop_is_checkpointed_every_n_steps_and_at_its_end(tmp_path: Path) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(DRAWS).raise_error()
    ip.run_cell(f"%%train --checkpoint {tmp_path} --every 10 --keep 10 --display off\n{STEPS}")
    names = [p.name for p in checkpoints(tmp_path)]
    # every 10 steps, and the end (the 30th step's is both: written twice under one name)
    assert names == ["step-00000010.pt", "step-00000020.pt", "step-00000030.pt"]
    summary = last_run()
    assert summary is not None
    assert summary.steps == 30


CARRIED = """
h = torch.zeros(1, 8)
for i in range(30):
    ix = torch.randint(0, X.shape[0], (32,))
    h = torch.tanh(0.5 * h + X[ix][:1])  # carried from pass to pass, like an RNN's hidden state
    loss = loss_fn(model(X[ix] + h), Y[ix])
    opt.zero_grad()
    loss.backward()
    if i == STOP and WHERE == "before the update":
        raise KeyboardInterrupt
    opt.step()
    h = h.detach()
    if i == STOP and WHERE == "after the update":
        raise KeyboardInterrupt
"""


@pytest.mark.parametrize("where", ["before the update", "after the update"])
def test_what_the_step_loop_carries_from_pass_to_pass_is_in_its_checkpoint(
    where: str, tmp_path: Path
) -> None:
    """zergtant's handbook 3.3: `prediction, h_state = rnn(x, h_state)` carries the hidden state
    in a notebook variable. The checkpoint held the weights but not `h_state`, so the resumed
    pass started from the interrupted pass's state and the weights differed; the rewrite names
    what a pass reads before binding it, and the checkpoint of the passes holds it."""
    plain = run([COMMON, DRAWS, CARRIED], None)
    expected, expected_h = weights(plain), plain.user_ns["h"].clone()
    ip, _, _ = interrupted_then_resumed(CARRIED, where, tmp_path)
    got = weights(ip)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []
    assert torch.equal(ip.user_ns["h"], expected_h)


NESTED = """
def train_epoch():
    global k
    for start in range(0, 256, 32):  # the steps, in a function the epoch loop calls
        k += 1
        ix = torch.randint(0, 480, (32,)) + shift
        loss = loss_fn(model(X[ix]), Y[ix])
        opt.zero_grad()
        loss.backward()
        if k == STOP and WHERE == "before the update":
            raise KeyboardInterrupt
        opt.step()
        if k == STOP and WHERE == "after the update":
            raise KeyboardInterrupt
"""

EPOCHS_OF_STEPS = """
for ep in range(3):
    shift = int(torch.randint(0, 32, ()))  # drawn by the epoch, before its steps
    train_epoch()
"""


@pytest.mark.parametrize("where", ["before the update", "after the update"])
def test_a_step_loop_in_the_epochs_of_another_is_checkpointed_by_its_passes(
    where: str, tmp_path: Path
) -> None:
    """Jonghwanshin's transformer tutorial: `for epoch in range(n): train()`, and `train()`
    steps through the data with `for batch, i in enumerate(range(0, T, bptt)):`. Only the
    outermost loop over a counter was checkpointed, so a Ctrl-C there wrote none; the inner
    loop's passes are now the checkpointed steps of the outer one's epochs, and `--resume`
    skips the epochs done, draws what the interrupted epoch drew before its steps again, and
    skips its steps done (8 steps an epoch; stopped in the 4th step of the 2nd epoch)."""
    setup = NESTED + "k = 0\n"
    expected = weights(run([COMMON, DRAWS, setup, EPOCHS_OF_STEPS], None))
    ip, interrupted, resumed = interrupted_then_resumed(
        EPOCHS_OF_STEPS, where, tmp_path, (COMMON, DRAWS, setup)
    )
    assert interrupted.outcome == "interrupted"
    done = 4 if where == "after the update" else 3
    assert any(f"after {done} passes of the training loop" in e for e in interrupted.events)
    assert resumed.optimizer_steps == 24 - 8 - done
    got = weights(ip)
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []
