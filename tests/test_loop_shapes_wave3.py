"""Loop shapes from the third wave of public training notebooks (benchmarks/loops_corpus3.toml)
that showed a failure class: each test is the notebook's shape, tiny, trained for real on the CPU
against the plain run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jupyter_trainmate import last_run

from .train_harness import (
    COMMON,
    assert_parity,
    fresh_shell,
    interrupt_then_resume,
    run,
    stopping_step,
    weights,
)


def interrupted_then_resumed(setup: str, cell: str, folder: Path) -> tuple[str, list[str]]:
    """`cell` under `%%train --checkpoint FOLDER`, stopped by a Ctrl-C the cell raises when the
    STOP that `setup` sets is reached, then run with `--resume`; the interrupted run's report
    and the weights that differ from the run never interrupted."""
    expected = weights(run([setup + "STOP = -1\n", cell], None))
    stop = int(setup.rsplit("STOP = ", 1)[1].split()[0])
    events: list[str] = []
    got = weights(interrupt_then_resume([setup], cell, folder, stop=stop, events=events))
    return " ".join(events), [k for k in expected if not torch.equal(expected[k], got[k])]


LR_FINDER = """
def find_lr(stop_at):
    for i, (xb, yb) in enumerate(loader):
        loss = loss_fn(model(xb), yb)
        if i == stop_at:  # "the loss exploded": the finder returns before backward()
            return
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize(
    "cell",
    [
        "find_lr(3)",
        "for i in range(8):\n"
        "    loss = loss_fn(model(x[:32]), y[:32])\n"
        "    if i == 3:\n"
        "        break\n"
        "    opt.zero_grad(); loss.backward(); opt.step()",
    ],
    ids=["batch-loop-left-by-return", "counter-loop-left-by-break"],
)
def test_a_loop_left_before_its_batch_trained_does_not_count_that_batch(cell: str) -> None:
    """sgugger's learning-rate finder returns from its batch loop when the loss explodes, after
    the forward and before backward(): that batch was counted as a step, with its samples."""
    summary, _ = assert_parity([COMMON, LR_FINDER, cell])
    assert (summary.steps, summary.optimizer_steps) == (3, 3)
    assert summary.samples in (96, 0)  # the batch loop counts 3 x 32; the range loop none


def test_a_loop_over_widths_calling_a_function_that_iterates_batches_is_no_batch_loop() -> None:
    """greydanus/mnist1d deep double descent: `for w in widths: fit(make(w))`, where fit() has
    the epoch and batch loops. The loop over a NumPy array was taken for a batch loop: each width
    counted as one more step, the pass as one more epoch (progress "epoch 3 of 2")."""
    setup = """
import numpy as np
def fit(net, epochs=2):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for epoch in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(net(xb), yb).backward()
            opt.step()
widths = np.array([4, 6])
nets = []
"""
    cell = """
for w in widths:
    net = nn.Sequential(nn.Linear(8, int(w)), nn.ReLU(), nn.Linear(int(w), 2))
    fit(net)
    nets.append(net)
"""
    summary, ip = assert_parity([COMMON, setup, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (32, 4, 1024)
    assert any("loop over widths (each pass that trains" in n for n in summary.instrumented)
    plain = run([COMMON, setup, cell], None)
    for ours, theirs in zip(ip.user_ns["nets"], plain.user_ns["nets"], strict=True):
        assert all(
            torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters(), strict=True)
        )


def test_xrange_is_a_counter_and_a_paired_next_inside_a_batch_loop_is_not_a_step() -> None:
    """zalando's VQ-VAE (`for i in xrange(n): next(iter(loader))`: each pass counted twice) and
    a second loader's batch drawn with next() inside a batch loop (counted as a second step)."""
    setup = "xrange = range\nSTOP = -1\n"
    summary, _ = assert_parity(
        [COMMON, setup, "for i in xrange(6):\n    xb, yb = next(iter(loader))\n"
         "    opt.zero_grad(); loss_fn(model(xb), yb).backward(); opt.step()"]
    )  # fmt: skip
    assert (summary.steps, summary.epochs) == (6, 0)
    paired = """
for epoch in range(2):
    other = iter(loader)
    for xb, yb in loader:
        xo, yo = next(other)
        opt.zero_grad()
        (loss_fn(model(xb), yb) + loss_fn(model(xo), yo)).backward()
        opt.step()
"""
    summary, _ = assert_parity([COMMON, setup, paired])
    assert (summary.steps, summary.epochs, summary.samples) == (16, 2, 512)


def test_a_validation_next_after_each_epochs_batch_loop_is_no_step() -> None:
    """An epoch's batch loop, then `next(iter(valid))` under no_grad (helper-57's example, left
    by the third wave): the next epoch's batches trained before another next() came, so the
    validation fetch counted as a step (26 steps for 24, and the samples a guess)."""
    cell = """
valid = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32)
for epoch in range(3):
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        xv, yv = next(iter(valid))
        val = loss_fn(model(xv), yv)
"""
    summary, _ = assert_parity([COMMON, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (24, 3, 768)
    assert summary.samples_source == "loader"


BATCHNORM = """
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
k = 0
"""


BN_BATCH_LOOP = """
for epoch in range(2):
    for xb, yb in loader:
        k += 1
        loss = loss_fn(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        if k == STOP:
            raise KeyboardInterrupt
        opt.step()
"""
BN_COUNTER_LOOP = """
for step in range(12):
    k += 1
    loss = loss_fn(model(x[:32]), y[:32])
    opt.zero_grad()
    loss.backward()
    if k == STOP:
        raise KeyboardInterrupt
    opt.step()
"""


@pytest.mark.parametrize(
    "cell", [BN_BATCH_LOOP, BN_COUNTER_LOOP], ids=["batch-loop", "counter-loop"]
)
def test_a_resumed_step_counts_in_batchnorm_statistics_once(cell: str, tmp_path: Path) -> None:
    """krishanwalia's house prices and josiahdavis' tabular net: a Ctrl-C between a batch's
    forward and its optimizer step. The checkpoint took the step back but kept BatchNorm's
    running statistics with that forward in them, and the resumed run counted it again
    (`num_batches_tracked` one more than the plain run's)."""
    report, differing = interrupted_then_resumed(COMMON + BATCHNORM + "STOP = 6\n", cell, tmp_path)
    assert "checkpoint" in report
    assert differing == []


def test_enumerate_goes_on_from_where_the_resumed_epoch_was() -> None:
    """Jackson-Kang's VAE (`batch_idx` in its print) and any warm-up by batch index: after a
    mid-epoch resume enumerate() started at 0 again, so the index was off by the batches done."""
    folder = Path("ckpt")
    setup = COMMON + "k = 0\nSTOP = 3\n"
    cell = """
for i, (xb, yb) in enumerate(loader):
    k += 1
    for group in opt.param_groups:
        group["lr"] = 0.01 * (i + 1)  # warm-up by the batch index
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    if k == STOP:
        raise KeyboardInterrupt
    opt.step()
last_i = torch.tensor(i)
"""
    _, differing = interrupted_then_resumed(setup, cell, folder)
    assert differing == []


GAN = """
G = nn.Linear(4, 8)
D = nn.Sequential(nn.Linear(8, 1))
opt_g = torch.optim.SGD(G.parameters(), lr=0.05)
opt_d = torch.optim.SGD(D.parameters(), lr=0.05)
k = 0
STOP = 3
"""
GAN_LOOP = """
for xb, _ in loader:
    k += 1
    opt_d.zero_grad()
    (D(G(torch.randn(32, 4)).detach()).mean() - D(xb).mean()).backward()
    opt_d.step()
    opt_g.zero_grad()
    (-D(G(torch.randn(32, 4))).mean()).backward()
    if k == STOP:
        raise KeyboardInterrupt  # after D's step, before G's
    opt_g.step()
"""


def test_a_ctrl_c_between_a_gans_two_steps_says_the_resume_can_differ(tmp_path: Path) -> None:
    """lyeoni's GAN and Yangyangii's WGAN-GP: the discriminator stepped, the generator not yet.
    The checkpoint counts that batch as done (its weights changed), so the generator's update
    from it is never made and the resumed run differs; the interrupted run now says so."""
    report, differing = interrupted_then_resumed(COMMON + GAN, GAN_LOOP, tmp_path)
    assert "that step had made 1 of the up to 2 optimizer steps" in report
    assert differing  # what the report warns of


def test_a_loop_that_takes_its_gradients_with_autograd_grad_is_a_training_loop(
    tmp_path: Path,
) -> None:
    """vmikulik's MAML: `torch.autograd.grad(...)`, the gradients set on `.grad` by hand, then
    `meta_opt.step()`; no backward(). The loop was not seen as training: no progress, and a
    Ctrl-C wrote no checkpoint. Its passes are now the steps, checkpointed and resumed."""
    setup = COMMON + "params = list(model.parameters())\nk = 0\nSTOP = 5\n"
    cell = """
for it in range(10):
    k += 1
    loss = loss_fn(model(x[:32]), y[:32])
    grads = torch.autograd.grad(loss, params)
    for p, g in zip(params, grads):
        p.grad = g
    if k == STOP:
        raise KeyboardInterrupt
    opt.step()
"""
    summary, _ = assert_parity([setup.replace("STOP = 5", "STOP = -1"), cell])
    assert summary.steps == 10
    assert any("loop over range(10)" in note for note in summary.instrumented)
    report, differing = interrupted_then_resumed(setup, cell, tmp_path)
    assert "after 4 passes of the training loop" in report
    assert differing == []


def test_a_name_moved_to_another_model_keeps_that_models_buffers() -> None:
    """morvan's batch-norm notebook: `for net, opt in zip(nets, opts)` moves `net` from model to
    model inside a step. The buffers copied as the step began belong to the model `net` named
    then; written into the checkpoint under `net` now, they would be another model's."""
    from jupyter_trainmate.runtime.buffers import StepBuffers

    nets = [torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)]
    namespace: dict[str, object] = {"net": nets[1]}
    buffers = StepBuffers(namespace)
    buffers.take()
    nets[0](torch.randn(4, 3))  # the step trains nets[0] ...
    namespace["net"] = nets[0]  # ... under the name `net`
    states = {"models": {"net": {k: v.clone() for k, v in nets[0].state_dict().items()}}}
    buffers.put_into(states, {"net": nets[0]})
    assert int(states["models"]["net"]["num_batches_tracked"]) == 1  # left as nets[0] has it
    nets[1](torch.randn(4, 3))
    states = {"models": {"net": {k: v.clone() for k, v in nets[1].state_dict().items()}}}
    buffers.put_into(states, {"net": nets[1]})
    assert int(states["models"]["net"]["num_batches_tracked"]) == 0  # as the step began


def test_a_step_loop_drawing_with_next_names_its_checkpoint_by_the_steps_done(
    tmp_path: Path,
) -> None:
    """zalando's VQ-VAE: `for i in xrange(n): next(iter(loader))`, a Ctrl-C in the fifth pass.
    The checkpoint was named step-00000005 after 4 passes: the pass's fetch was still counted."""
    cell = """
for i in range(10):
    k += 1
    xb, yb = next(iter(loader))
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    if k == STOP:
        raise KeyboardInterrupt
    opt.step()
"""
    report, differing = interrupted_then_resumed(COMMON + "k = 0\nSTOP = 5\n", cell, tmp_path)
    assert "after 4 passes of the training loop" in report
    assert "step-00000004.pt" in report
    assert differing == []


def test_a_resume_inside_a_functions_batch_loop_names_the_locals_that_start_over(
    tmp_path: Path,
) -> None:
    """sgugger's learning-rate finder: find_lr() raises the learning rate batch by batch in a
    local variable. Resumed in the middle of its epoch, the function starts again with its first
    `lr`: other weights, and nothing said. No checkpoint holds a function's locals; the resumed
    run now names those its batches carry."""
    setup = COMMON + "k = 0\nSTOP = 4\n"
    cell = """
def find_lr(start=1e-3, factor=1.5):
    lr, seen = start, 0
    for xb, yb in loader:
        global k
        k += 1
        seen += 1
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        if k == STOP:
            raise KeyboardInterrupt
        opt.step()
        lr *= factor
find_lr()
"""
    expected = weights(run([setup.replace("STOP = 4", "STOP = -1"), cell], None))
    ip = fresh_shell()
    ip.run_cell(setup).raise_error()
    line = f"--checkpoint {tmp_path} --display off"
    ip.run_cell(f"%%train {line}\n{cell}")
    ip.user_ns["STOP"] = -1
    ip.run_cell(f"%%train {line} --resume\n{cell}").raise_error()
    resumed = last_run()
    assert resumed is not None
    said = [e for e in resumed.events if "find_lr's own variables" in e]
    assert said, resumed.events
    assert "variables lr, seen carry from batch to batch" in said[0]  # not `global k`
    got = weights(ip)
    assert any(not torch.equal(expected[k], got[k]) for k in expected)  # as the message says


def test_a_helper_looping_over_models_leaves_the_batch_loop_a_batch_loop() -> None:
    """A second pair of eyes on this wave's change: `train_all(xb, yb)` loops over the notebook's
    models (`for net, o in zip(nets, opts)`); that loop is no batch loop, so the cell's loop over
    `loader` stays the batch loop (it had become a counter loop: 16 epochs, 32 steps)."""
    setup = """
nets = [nn.Linear(8, 2), nn.Linear(8, 2)]
opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
def train_all(xb, yb):
    for net, o in zip(nets, opts):
        o.zero_grad()
        loss_fn(net(xb), yb).backward()
        o.step()
"""
    cell = "for epoch in range(2):\n    for xb, yb in loader:\n        train_all(xb, yb)\n"
    summary, _ = assert_parity([COMMON, setup, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (16, 2, 512)


def test_checkpoints_of_a_lazy_module_and_under_accumulate(tmp_path: Path) -> None:
    """The same review: a `LazyBatchNorm1d` (its buffers uninitialised until the first forward)
    made `--checkpoint` fail before the first step; and under `--accumulate 2` a Ctrl-C in a
    window said the step had made 1 of 2 optimizer steps when it had made none."""
    lazy = COMMON + (
        "model = nn.Sequential(nn.Linear(8, 16), nn.LazyBatchNorm1d(), nn.ReLU(), nn.Linear(16, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    )
    loop = "for xb, yb in loader:\n    opt.zero_grad()\n    loss_fn(model(xb), yb).backward()\n    opt.step()\n"
    assert_parity([lazy, loop], f"--checkpoint {tmp_path / 'lazy'}")
    cell = "for xb, yb in loader:\n" + stopping_step(4)
    ip = fresh_shell()
    ip.run_cell(COMMON + "k = 0\nSTOP = 3\n").raise_error()
    ip.run_cell(f"%%train --accumulate 2 --checkpoint {tmp_path / 'acc'} --display off\n{cell}")
    interrupted = last_run()
    assert interrupted is not None
    assert interrupted.outcome == "interrupted"
    events = list(interrupted.events)
    assert any("checkpoint" in e for e in events)
    assert not any("optimizer steps a step has made" in e for e in events)
