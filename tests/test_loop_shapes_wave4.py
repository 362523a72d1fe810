"""Loop shapes from the fourth wave of public training notebooks (benchmarks/loops_corpus4.toml)
that showed a failure class: each test is the notebook's shape, tiny, trained for real on the CPU
against the plain run (or, for --resume, against the run never interrupted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from jupyter_trainmate import last_run
from jupyter_trainmate.runtime.session import TrainSession
from jupyter_trainmate.runtime.summary import RunProgress

from .train_harness import (
    COMMON,
    assert_parity,
    interrupt_then_resume,
    run,
    stopping_step,
    weights,
)

TRAINER = """
class Trainer:
    def __init__(self):
        self.net = nn.Linear(8, 2)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
    def fit(self, epochs=2):
        for epoch in range(epochs):
            for xb, yb in loader:
                self.opt.zero_grad()
                loss_fn(self.net(xb), yb).backward()
                self.opt.step()
"""


def resumed(setup: str, cell: str, folder: Path, stop: int, names: tuple[str, ...] = ()) -> tuple[
    list[str], list[str]
]:  # fmt: skip
    """`cell` interrupted by the Ctrl-C it raises at STOP, then resumed; the interrupted run's
    events and what differs from the run never interrupted (the models' weights and `names`)."""
    plain = run([setup, "STOP = -1", cell], None)
    events: list[str] = []
    ip = interrupt_then_resume([setup], cell, folder, stop=stop, events=events)
    expected, got = weights(plain), weights(ip)
    differing = [k for k in expected if not torch.equal(expected[k], got[k])]
    for name in names:
        a, b = plain.user_ns[name], ip.user_ns[name]
        same = torch.equal(torch.as_tensor(a), torch.as_tensor(b)) if a is not None else b is None
        if not same:
            differing.append(name)
    return events, differing


def test_a_counter_loop_that_steps_through_a_function_the_cell_defines_is_checkpointed(
    tmp_path: Path,
) -> None:
    """The Sod shock-tube PINN: `def train(epoch): ... optimizer.step(closure)` and `for epoch in
    range(...): train(epoch)` in one cell. The loop was no training loop (only functions from
    earlier cells counted): a Ctrl-C wrote no checkpoint and --resume had nothing to continue."""
    cell = """
def train(epoch):
    global k
    k += 1
    def closure():
        opt.zero_grad()
        loss = loss_fn(model(x[:64]), y[:64])
        loss.backward()
        return loss
    if k == STOP:
        raise KeyboardInterrupt
    opt.step(closure)
for epoch in range(1, 9):
    train(epoch)
"""
    events, differing = resumed(COMMON + "k = 0\n", cell, tmp_path, stop=5)
    assert "after 4 passes of the training loop" in events[0]
    assert differing == []
    summary, _ = assert_parity([COMMON, "k = 0\nSTOP = -1\n", cell])
    assert (summary.steps, summary.epochs) == (8, 0)


def test_a_cell_function_that_iterates_batches_makes_the_loop_calling_it_an_epoch_loop() -> None:
    """`def train_epoch(): for xb, yb in loader: ...` and a loop over learning rates calling it,
    in one cell: a guard for the change the test above needed (the cell's own functions now
    count as training): the loop over the list is an epoch loop, not a batch loop."""
    cell = """
def train_epoch():
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
for lr in [0.1, 0.05]:
    for group in opt.param_groups:
        group["lr"] = lr
    train_epoch()
"""
    summary, _ = assert_parity([COMMON, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (16, 2, 512)


def test_methods_of_an_object_the_training_cell_makes_are_reached(tmp_path: Path) -> None:
    """DA-RNN (`model = DA_rnn(...)`, then `model.train()` holding the loops) and qfettes' DQN
    (`model = Model(...)`, then a frame loop calling `model.update(...)`), made in the training
    cell itself: the methods were not looked into (0 epochs of 2; the frame loop not watched)."""
    summary, _ = assert_parity([COMMON, TRAINER, "trainer = Trainer()\ntrainer.fit()"])
    assert (summary.steps, summary.epochs, summary.samples) == (16, 2, 512)
    assert any("batch loop over loader" in note for note in summary.instrumented)
    learn = (
        TRAINER
        + """
    def learn(self, t):
        self.opt.zero_grad()
        loss_fn(self.net(x[32 * t : 32 * t + 32]), y[32 * t : 32 * t + 32]).backward()
        self.opt.step()
"""
    )
    cell = "agent = Trainer()\nfor t in range(8):\n    agent.learn(t)\n"
    summary, _ = assert_parity([COMMON, learn, cell])
    assert summary.steps == 8
    assert any("loop over range(8)" in note for note in summary.instrumented)


def test_a_ctrl_c_in_a_run_whose_optimizer_no_checkpoint_holds_writes_none(tmp_path: Path) -> None:
    """qfettes' DQN: the agent made in the cell holds its optimizer as an attribute. The run
    wrote a checkpoint of the notebook's variables (none of them the agent's), and the resumed
    run, skipping the frames done with an empty replay memory, failed in the notebook's own
    code (`random.sample` larger than the memory) before the refusal at its first step could
    say why. The interrupted run now says it, and writes nothing."""
    learn = (
        TRAINER
        + """
    def learn(self, t):
        global k
        k += 1
        self.opt.zero_grad()
        loss_fn(self.net(x[32 * t : 32 * t + 32]), y[32 * t : 32 * t + 32]).backward()
        if k == STOP:
            raise KeyboardInterrupt
        self.opt.step()
"""
    )
    cell = "agent = Trainer()\nfor t in range(8):\n    agent.learn(t)\n"
    events: list[str] = []
    interrupt_then_resume(
        [COMMON, learn, "k = 0"], cell, tmp_path, resume=False, stop=5, events=events
    )
    assert "no checkpoint written: the run steps an optimizer that is not a notebook" in events[0]
    assert not list(tmp_path.glob("*.pt"))


def test_a_tqdm_range_step_loop_gets_back_what_its_passes_carry(tmp_path: Path) -> None:
    """The normalizing-flows RealNVP notebook: `for it in tqdm(range(n))` with a history grown by
    `np.append` and (here) a state carried from pass to pass. `range(n)` got them back on
    --resume, `tqdm(range(n))` did not: the history lost the interrupted run's values and the
    carried state started over, so the weights differed too."""
    setup = COMMON + "import numpy as np\nfrom tqdm import tqdm\nk = 0\n"
    cell = """
h = torch.zeros(1, 8)
hist = np.array([])
for i in tqdm(range(8), disable=True):
    k += 1
    h = torch.tanh(0.5 * h + x[i : i + 1])
    loss = loss_fn(model(x[32 * i : 32 * i + 32] + h), y[32 * i : 32 * i + 32])
    opt.zero_grad()
    loss.backward()
    if k == STOP:
        raise KeyboardInterrupt
    opt.step()
    hist = np.append(hist, loss.item())
"""
    events, differing = resumed(setup, cell, tmp_path, stop=5, names=("h", "hist"))
    assert "after 4 passes of the training loop" in events[0]
    assert differing == []


def test_a_state_the_cells_own_batch_loop_carries_is_put_back_on_resume(tmp_path: Path) -> None:
    """DSKSD's RNN language model: `hidden = model.init_hidden()` at each epoch's start, then a
    batch loop that detaches and carries it. Resumed in the middle of an epoch, the loop skipped
    the batches done but began from the epoch's fresh state, not from the one the last batch
    done left: every weight differed, and nothing said so. The checkpoint now holds what the
    cell's own batch loop carries (notebook variables), as of the batch it resumes at."""
    setup = (
        COMMON
        + "cell = nn.RNNCell(8, 8)\nhead = nn.Linear(8, 2)\nk = 0\n"
        + ("opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)\n")
    )
    loop = """
for epoch in range(2):
    h = torch.zeros(32, 8)
    running = 0.0
    for xb, yb in loader:
        k += 1
        h = h.detach()
        h = cell(xb, h)
        loss = loss_fn(head(h), yb)
        opt.zero_grad()
        loss.backward()
        if k == STOP:
            raise KeyboardInterrupt
        opt.step()
        running += loss.item()
"""
    events, differing = resumed(setup, loop, tmp_path, stop=11, names=("h", "running"))
    assert "in epoch 2 after 2 batches" in events[0]
    assert differing == []


def test_an_interrupted_runs_summary_counts_what_its_checkpoint_holds(tmp_path: Path) -> None:
    """A Ctrl-C between backward() and the optimizer step: the checkpoint takes that step back
    and --resume redoes it, but the interrupted run's summary counted it (9 steps, 8 optimizer
    steps, and the epoch it began), so the two runs' summaries added up to one step more than
    the run never interrupted. Batch loops and step loops alike."""
    batch_loop = "for epoch in range(2):\n    for xb, yb in loader:\n" + stopping_step(8)
    step_loop = """
for i in range(8):
    k += 1
    opt.zero_grad()
    loss_fn(model(x[32 * i : 32 * i + 32]), y[32 * i : 32 * i + 32]).backward()
    if k == STOP:
        raise KeyboardInterrupt
    opt.step()
"""
    for folder, loop, stop, counts in (
        ("batches", batch_loop, 9, (8, 8, 256, 1)),
        ("passes", step_loop, 5, (4, 4, 0, 0)),
    ):
        ip = interrupt_then_resume(
            [COMMON, "k = 0"], loop, tmp_path / folder, stop=stop, resume=False
        )
        interrupted = last_run()
        assert interrupted is not None
        got = (
            interrupted.steps,
            interrupted.optimizer_steps,
            interrupted.samples,
            interrupted.epochs,
        )
        assert got == counts, (folder, interrupted.events)
        ip.user_ns["STOP"] = -1
        ip.run_cell(
            f"%%train --checkpoint {tmp_path / folder} --display off --resume\n{loop}"
        ).raise_error()
        resumed_run = last_run()
        assert resumed_run is not None
        assert interrupted.steps + resumed_run.steps == (16 if folder == "batches" else 8)


def test_a_batch_of_records_is_counted_by_its_records() -> None:
    """DSKSD's NMT and DMN notebooks: a generator yields lists of (source, target) pairs of
    tensors, one sequence each, or a tuple whose first item is a list of per-story tensors. The
    guess read the first tensor's leading dimension, one sequence's length: 8 samples reported
    for 400. It counts the records now (still a guess, and said to be)."""
    cell = """
pairs = [(x[i : i + 1], y[i : i + 1]) for i in range(64)]
def get_batch(data, size=16):
    for i in range(0, len(data), size):
        yield data[i : i + size]
def stories():
    yield [x[i : i + 5] for i in range(8)], y[:8]
for epoch in range(2):
    for batch in get_batch(pairs):
        xb = torch.cat([p[0] for p in batch])
        yb = torch.cat([p[1] for p in batch])
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    for facts, targets in stories():
        opt.zero_grad()
        loss_fn(model(torch.stack([f.sum(0) for f in facts])), targets).backward()
        opt.step()
"""
    summary, _ = assert_parity([COMMON, cell])
    assert (summary.steps, summary.samples) == (10, 2 * 64 + 2 * 8)
    assert summary.samples_source == "batch dim 0"


def test_a_resumed_run_of_an_epoch_loop_calling_train_ends_at_its_last_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The torchaudio tutorials' `for epoch in range(2): train(model, epoch)`, train() holding
    the batch loop: a run resumed in the second epoch ended showing "epoch 1 of 2", 50% (the
    same loop with the batch loop written inside showed 2 of 2). The epochs the counter loop
    skipped were not counted as seen once its passes turned out to be epochs."""
    cell = (
        "def train():\n    global k\n    for xb, yb in loader:\n"
        + stopping_step(8)
        + "for epoch in range(2):\n    train()\n"
    )
    seen: list[RunProgress] = []
    close = TrainSession.close

    def recorded(self: TrainSession, outcome: Any) -> Any:
        seen.append(self.progress())
        return close(self, outcome)

    monkeypatch.setattr(TrainSession, "close", recorded)
    interrupt_then_resume([COMMON, "k = 0"], cell, tmp_path, stop=11)
    at_end = seen[-1]
    assert (at_end.epoch, at_end.epochs_total, at_end.fraction) == (2, 2, 1.0)


def test_no_checkpoint_at_all_for_a_run_whose_optimizer_no_notebook_variable_holds(
    tmp_path: Path,
) -> None:
    """jovian's ResNet9: `fit_one_cycle()` makes its optimizer inside. The Ctrl-C in the second
    epoch wrote none, but the first epoch's end had: --resume took that one and refused at its
    first step. No checkpoint of such a run is written, at an epoch's end either."""
    cell = (
        "def fit(epochs):\n    global k\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(epochs):\n        for xb, yb in loader:\n"
        + stopping_step(12)
        + "fit(2)\n"
    )
    events: list[str] = []
    interrupt_then_resume([COMMON, "k = 0"], cell, tmp_path, resume=False, stop=11, events=events)
    assert "no checkpoint written: the run steps an optimizer that is not a notebook" in events[0]
    assert not list(tmp_path.glob("*.pt"))
