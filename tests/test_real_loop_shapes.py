"""Loop shapes found in public training notebooks (benchmarks/loops_corpus.toml) that the other
shape tests do not cover. Each ends bit-identical to the plain run and reports the real counts:
steps are batches that trained, epochs are passes over the training data, samples are counted
from the loader when it is known (and the summary says when a count is a guess)."""

from __future__ import annotations

import re

import pytest
import torch

from jupyter_trainmate import last_run

from .train_harness import COMMON, assert_parity, run

# In a %%train run the cell can read the live progress (what the widget and the sidebar show);
# in the plain run the name does not exist and the line does nothing.
PROGRESS = '(__trainmate__.progress() if "__trainmate__" in globals() else None)'

RUN_EPOCH = """
train_loader = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=32, shuffle=True)
val_loader = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32)

def run_epoch(data, train):
    model.train(train)
    total = 0.0
    for xb, yb in data:
        loss = loss_fn(model(xb), yb)
        if train:
            opt.zero_grad()
            loss.backward()
            opt.step()
        total += loss.item()
    return total / len(data)
"""


@pytest.mark.parametrize("no_grad", [True, False], ids=["under-no-grad", "eval-mode-only"])
def test_one_run_epoch_for_training_and_validation(no_grad: bool) -> None:
    """Validation batches are not training steps and a validation pass is not an epoch: a batch
    counts when a backward() or an optimizer step happened while it was in hand. `model.training`
    would not do (LBFGS loops train in eval mode; many notebooks never call eval()), nor would
    grad mode (this loop validates with gradients on when `no_grad` is False)."""
    validate = (
        "    with torch.no_grad():\n        val_loss = run_epoch(val_loader, False)"
        if no_grad
        else "    val_loss = run_epoch(val_loader, False)"
    )
    cell = f"""
history = []
for epoch in range(3):
    train_loss = run_epoch(train_loader, True)
{validate}
    history.append((train_loss, val_loss))
    progress = {PROGRESS}
"""
    summary, ip = assert_parity([COMMON, RUN_EPOCH, cell])
    assert (summary.epochs, summary.steps, summary.optimizer_steps) == (3, 12, 12)
    assert summary.samples == 3 * 128
    progress = ip.user_ns["progress"]  # after the last validation pass
    assert (progress.epoch, progress.epochs_total) == (3, 3)
    assert (progress.steps, progress.steps_per_epoch) == (12, 4)
    assert progress.fraction == pytest.approx(1.0)


def test_range_loop_with_hand_made_batches_moves_the_progress() -> None:
    cell = f"""
perm = torch.randperm(len(x))
for step in range(16):
    idx = perm[(step * 32) % len(x):][:32]
    opt.zero_grad()
    loss_fn(model(x[idx]), y[idx]).backward()
    opt.step()
    if step == 7:
        middle = {PROGRESS}
end = {PROGRESS}
"""
    summary, ip = assert_parity([COMMON, cell])
    assert (summary.steps, summary.optimizer_steps, summary.epochs) == (16, 16, 0)
    assert ip.user_ns["middle"].steps == 8  # counted when its iteration starts, as a batch is
    assert ip.user_ns["end"].steps == 16
    assert summary.samples_source == "none"
    assert "samples not counted" in summary.line()


def test_while_loop_with_hand_made_batches_moves_the_progress() -> None:
    """No iterator to time and nothing to wrap: the live progress counts backward() calls, as
    the summary does, instead of standing at step 0."""
    cell = f"""
step = 0
while step < 16:
    idx = torch.randint(0, len(x), (32,))
    opt.zero_grad()
    loss_fn(model(x[idx]), y[idx]).backward()
    opt.step()
    step += 1
    if step == 8:
        middle = {PROGRESS}
"""
    summary, ip = assert_parity([COMMON, cell])
    assert (summary.steps, summary.optimizer_steps) == (16, 16)
    middle = ip.user_ns["middle"]
    assert middle.steps == 8
    assert middle.steps_per_s > 0


def test_range_loop_with_manual_next_counts_each_batch_once() -> None:
    cell = f"""
it = iter(loader)
for step in range(20):
    try:
        xb, yb = next(it)
    except StopIteration:
        it = iter(loader)
        xb, yb = next(it)
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
end = {PROGRESS}
"""
    summary, ip = assert_parity([COMMON, cell])
    assert (summary.steps, summary.optimizer_steps) == (20, 20)
    assert ip.user_ns["end"].steps == 20
    assert summary.samples == 20 * 32


def test_two_backward_calls_per_iteration_are_one_step() -> None:
    """A GAN written as a range loop that draws its own batches: one iteration, one step."""
    setup = """
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
del model, opt
"""
    cell = """
for step in range(20):
    real = torch.randn(16, 8) + 2
    fake = G(torch.randn(16, 4))
    g_loss = torch.log(1 - D(fake)).mean()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    d_loss = -(torch.log(D(real)) + torch.log(1 - D(fake.detach()))).mean()
    opt_d.zero_grad()
    d_loss.backward(retain_graph=True)
    opt_d.step()
"""
    summary, _ = assert_parity([COMMON, setup, cell])
    assert (summary.steps, summary.optimizer_steps) == (20, 40)
    assert not re.search(r"(?<![\d.,])0 steps \(", summary.line())


def test_epoch_loop_in_the_cell_and_batch_loop_in_a_called_function() -> None:
    functions = """
def train_one_epoch():
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
"""
    cell = f"""
for epoch in range(3):
    train_one_epoch()
    if epoch == 1:
        after_two = {PROGRESS}
"""
    summary, ip = assert_parity([COMMON, functions, cell])
    assert (summary.epochs, summary.steps, summary.samples) == (3, 24, 3 * 256)
    progress = ip.user_ns["after_two"]
    assert (progress.epoch, progress.epochs_total, progress.steps_per_epoch) == (2, 3, 8)
    assert progress.fraction == pytest.approx(2 / 3)
    assert progress.eta_s is not None


def test_epoch_loop_calls_a_function_that_slices_time_major_batches() -> None:
    """The language-model tutorial shape: `train()` walks a (T, B) tensor by range(0, T, bptt)."""
    setup = """
torch.manual_seed(0)
tokens = torch.randint(0, 20, (41, 6))  # (T, B)
lm = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 20))
lm_opt = torch.optim.SGD(lm.parameters(), lr=0.5)
bptt = 10
del model, opt

def train():
    lm.train()
    for batch, i in enumerate(range(0, tokens.size(0) - 1, bptt)):
        data, target = tokens[i:i + bptt], tokens[i + 1:i + 1 + bptt]
        lm_opt.zero_grad()
        loss = nn.functional.cross_entropy(lm(data).view(-1, 20), target.reshape(-1))
        loss.backward()
        lm_opt.step()

def evaluate():
    lm.eval()
    with torch.no_grad():
        return sum(nn.functional.cross_entropy(lm(tokens[i:i + bptt]).view(-1, 20),
                   tokens[i + 1:i + 1 + bptt].reshape(-1)).item() for i in range(0, 40, bptt))
"""
    cell = f"""
for epoch in range(1, 4):
    train()
    val = evaluate()
    if epoch == 2:
        middle = {PROGRESS}
"""
    summary, ip = assert_parity([COMMON, setup, cell])
    assert (summary.epochs, summary.steps, summary.optimizer_steps) == (3, 12, 12)
    progress = ip.user_ns["middle"]
    assert (progress.epoch, progress.epochs_total, progress.steps) == (2, 3, 8)
    assert progress.steps_per_epoch == 4
    assert progress.fraction == pytest.approx(2 / 3)


def test_time_major_batches_from_a_loader_count_samples_by_its_batch_size() -> None:
    setup = """
torch.manual_seed(0)
sequences = torch.randn(100, 12, 4)  # 100 samples of 12 time steps
targets = torch.randn(100, 1)

def time_major(items):
    return torch.stack([s for s, _ in items], 1), torch.stack([t for _, t in items])

seq_loader = DataLoader(TensorDataset(sequences, targets), batch_size=16, shuffle=True, collate_fn=time_major)
rnn = nn.GRU(4, 8)
head = nn.Linear(8, 1)
rnn_opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=1e-2)
del model, opt
"""
    cell = """
for epoch in range(2):
    for seq, target in seq_loader:  # seq: (T=12, B<=16, 4)
        rnn_opt.zero_grad()
        out, _ = rnn(seq)
        nn.functional.mse_loss(head(out[-1]), target).backward()
        rnn_opt.step()
"""
    summary, _ = assert_parity([COMMON, setup, cell])
    assert (summary.steps, summary.epochs) == (14, 2)
    assert summary.samples == 2 * 100  # not 14 * 12 time steps; the last batch holds 4
    assert summary.samples_source == "loader"
    assert "guess" not in summary.line()


def test_numpy_batches_count_their_rows_and_say_it_is_a_guess() -> None:
    cell = """
import numpy as np
x_np, y_np = x.numpy(), y.numpy()
batches = [(x_np[i:i + 32], y_np[i:i + 32]) for i in range(0, 256, 32)]
for epoch in range(2):
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(model(torch.from_numpy(xb)), torch.from_numpy(yb)).backward()
        opt.step()
"""
    summary, _ = assert_parity([COMMON, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (16, 2, 512)
    assert summary.samples_source == "batch dim 0"
    assert "guess" in summary.line()


def test_loop_over_models_inside_the_batch_loop_is_not_the_batch_loop() -> None:
    setup = """
nets = [nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)) for _ in range(2)]
opts = [torch.optim.Adam(net.parameters(), lr=1e-2) for net in nets]
del model, opt
"""
    cell = """
for epoch in range(2):
    for step, (xb, yb) in enumerate(loader):
        for net, o in zip(nets, opts):
            o.zero_grad()
            loss_fn(net(xb), yb).backward()
            o.step()
"""
    summary, _ = assert_parity([COMMON, setup, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (16, 2, 512)
    assert summary.optimizer_steps == 32
    assert any("batch loop over enumerate(loader)" in n for n in summary.instrumented)


def test_a_step_function_passed_as_an_argument_still_reports_steps() -> None:
    """The batch loop calls a closure it was handed: the rewrite cannot see its backward(), but
    the closure trains in one call and `mini_batch` is handed it, so the comprehension in
    `mini_batch` is the batch loop and the loop around it the epochs (before: the steps were
    counted at the optimizer steps and no epoch at all). The summary never says "0 steps (N
    optimizer steps)"; the closure is still named as left alone."""
    functions = """
def make_train_step(model, loss_fn, opt):
    def step(xb, yb):
        model.train()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return step

def mini_batch(data, step_fn):
    return [step_fn(xb, yb) for xb, yb in data]

train_step = make_train_step(model, loss_fn, opt)
"""
    cell = """
for epoch in range(3):
    losses = mini_batch(loader, train_step)
"""
    summary, _ = assert_parity([COMMON, functions, cell])
    assert summary.optimizer_steps == 24
    assert (summary.steps, summary.epochs, summary.samples) == (24, 3, 768)
    assert not re.search(r"(?<![\d.,])0 steps \(", summary.line())
    assert any("batch comprehension over data" in n for n in summary.instrumented)
    assert any("train_step" in note and "closure" in note for note in summary.left_alone)


def test_generator_batches_and_hand_written_sgd_on_leaf_tensors() -> None:
    """No module and no optimizer: the notebook's own `sgd()` updates two leaf tensors."""
    cell_setup = """
import random
random.seed(0)
features = torch.randn(200, 2)
labels = 2 * features[:, 0] - 3.4 * features[:, 1] + 4.2
w = torch.zeros(2, 1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)

def data_iter(batch_size, features, labels):
    order = list(range(len(features)))
    random.shuffle(order)
    for i in range(0, len(features), batch_size):
        j = torch.tensor(order[i:i + batch_size])
        yield features[j], labels[j]

def sgd(params, lr, batch_size):
    for p in params:
        p.data -= lr * p.grad / batch_size
"""
    cell = """
for epoch in range(3):
    for X, t in data_iter(10, features, labels):
        l = ((X @ w + b - t.view(-1, 1)) ** 2 / 2).sum()
        l.backward()
        sgd([w, b], 0.03, 10)
        w.grad.data.zero_()
        b.grad.data.zero_()
"""
    plain = run([COMMON, cell_setup, cell], None)
    trained = run([COMMON, cell_setup, cell], "")
    for name in ("w", "b"):
        assert torch.equal(plain.user_ns[name], trained.user_ns[name])
    summary = last_run()
    assert summary is not None
    assert (summary.steps, summary.epochs, summary.samples) == (60, 3, 600)


def test_training_function_defined_and_called_in_the_same_cell() -> None:
    cell = """
def fit(net, data, epochs):
    for epoch in range(epochs):
        for xb, yb in data:
            opt.zero_grad()
            loss_fn(net(xb), yb).backward()
            opt.step()

fit(model, loader, 2)
"""
    summary, _ = assert_parity([COMMON, cell])
    assert (summary.steps, summary.epochs, summary.samples) == (16, 2, 512)


LBFGS_CLOSURE = """
    def closure():
        lbfgs.zero_grad()
        loss = loss_fn(model({inputs}), {targets})
        loss.backward()
        return loss
    lbfgs.step(closure)
"""


def test_a_batch_loop_stepping_lbfgs_with_a_closure_is_the_batch_loop() -> None:
    """The backward() is in a closure the body defines: the loop still trains, and each batch is
    one step however often LBFGS runs the closure."""
    cell = "lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)\n"
    cell += "for xb, yb in loader:" + LBFGS_CLOSURE.format(inputs="xb", targets="yb")
    summary, _ = assert_parity([COMMON, cell])
    assert any("batch loop over loader" in note for note in summary.instrumented)
    assert (summary.steps, summary.optimizer_steps, summary.epochs) == (8, 8, 1)
    assert summary.samples == 256


def test_a_while_loop_around_lbfgs_counts_optimizer_steps_not_closure_runs() -> None:
    """The style-transfer shape: `while run[0] <= n: ... optimizer.step(closure)`."""
    cell = "lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)\nrounds = 0\n"
    cell += "while rounds < 3:" + LBFGS_CLOSURE.format(inputs="x", targets="y")
    cell += "    rounds += 1\n"
    summary, _ = assert_parity([COMMON, cell])
    assert (summary.steps, summary.optimizer_steps) == (3, 3)
