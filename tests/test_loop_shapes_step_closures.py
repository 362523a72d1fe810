"""A training step made by a factory (`train_step_fn = make_train_step_fn(model, loss_fn, opt)`,
dvgodoy/PyTorchStepByStep and the courses that follow it): a closure `%%train` cannot rewrite,
called in the cell's batch loop or handed to a notebook function that loops over batches
(`mini_batch(device, loader, train_step_fn)`). Before, the rewrite saw no training loop (the
closure's backward() is out of its reach) and a run reported 0 epochs; the counts now come
from the loops around it. Trained for real on the CPU, bit-identical to the plain cell."""

from __future__ import annotations

from .train_harness import COMMON, assert_parity

FACTORY = """
val_loader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32)

def make_train_step_fn(model, loss_fn, optimizer):
    def perform_train_step_fn(xb, yb):
        model.train()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()
    return perform_train_step_fn

def make_val_step_fn(model, loss_fn):
    def perform_val_step_fn(xb, yb):
        model.eval()
        return loss_fn(model(xb), yb).item()
    return perform_val_step_fn

def mini_batch(device, data_loader, step_fn):
    losses = []
    for xb, yb in data_loader:
        losses.append(step_fn(xb.to(device), yb.to(device)))
    return sum(losses) / len(losses)

train_step_fn = make_train_step_fn(model, loss_fn, opt)
val_step_fn = make_val_step_fn(model, loss_fn)
device = "cpu"
"""


def test_a_step_closure_handed_to_a_notebook_function_counts_epochs() -> None:
    """The epoch loop calls `mini_batch` with the step closure, for training and (under
    no_grad, the same function) for validation: 3 epochs of 8 training batches; the
    validation batches are no steps."""
    cell = """
losses, val_losses = [], []
for epoch in range(3):
    losses.append(mini_batch(device, loader, train_step_fn))
    with torch.no_grad():
        val_losses.append(mini_batch(device, val_loader, val_step_fn))
"""
    summary, ip = assert_parity([COMMON, FACTORY, cell])
    assert (summary.steps, summary.epochs, summary.optimizer_steps) == (24, 3, 24)
    assert summary.samples == 3 * 256
    assert len(ip.user_ns["val_losses"]) == 3


def test_a_step_closure_called_in_the_cells_batch_loop_counts_epochs() -> None:
    cell = """
for epoch in range(2):
    for xb, yb in loader:
        train_step_fn(xb, yb)
"""
    summary, _ = assert_parity([COMMON, FACTORY, cell])
    assert (summary.steps, summary.epochs, summary.optimizer_steps) == (16, 2, 16)


def test_a_closure_that_loops_over_batches_itself_is_not_taken_for_a_step() -> None:
    """A closure holding its own batch loop (an epoch function made by a factory) is out of
    reach too, but one call of it is no step: the loop around it stays untouched and the steps
    are counted at the optimizer steps, as before."""
    epoch_factory = """
def make_epoch_fn(model, loss_fn, optimizer, data_loader):
    def one_epoch():
        for xb, yb in data_loader:
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return one_epoch

epoch_fn = make_epoch_fn(model, loss_fn, opt, loader)
"""
    cell = """
for epoch in range(2):
    epoch_fn()
"""
    summary, _ = assert_parity([COMMON, epoch_factory, cell])
    assert (summary.steps, summary.optimizer_steps) == (16, 16)
