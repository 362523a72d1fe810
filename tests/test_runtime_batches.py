"""The batches collaborator on its own (no rewrite, no IPython): counts, position, window ends."""

from __future__ import annotations

import pytest
import torch

from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.runtime.session import TrainSession


def session(**options: object) -> TrainSession:
    model = torch.nn.Linear(2, 1)
    namespace = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    return TrainSession(TrainOptions(**options), namespace)  # type: ignore[arg-type]


def train_on(s: TrainSession, batch: torch.Tensor) -> None:
    """What a rewritten training step calls: a batch counts as a step once it trained."""
    model, opt = s._namespace["model"], s._namespace["opt"]
    s.zero_grad(opt)
    s.backward(model(batch).sum())  # type: ignore[operator]
    s.step(opt)


BATCHES = [torch.ones(3, 2)] * 4


def test_epochs_steps_and_position_as_the_loops_run() -> None:
    s = session()
    seen = []
    for epoch in s.epochs(range(3)):
        for i, batch in enumerate(s.batches(BATCHES)):
            train_on(s, batch)
            at = s.progress()
            seen.append((at.epoch, at.step_in_epoch, at.fraction))
            if (epoch, i) == (1, 1):
                assert (at.steps, at.samples, at.steps_per_epoch, at.epochs_total) == (6, 18, 4, 3)
    # In the run's first batch nothing has trained yet (a validation pass would look the same);
    # from then on each pass shows as the epoch in progress from its first batch.
    assert seen[0] == (0, 0, None)
    assert seen[1] == (1, 2, pytest.approx(2 / 12))
    assert seen[4] == (2, 1, pytest.approx(5 / 12))
    assert seen[5] == (2, 2, pytest.approx(6 / 12))
    assert seen[-1] == (3, 4, pytest.approx(1.0))
    after = s.progress()
    assert (after.epoch, after.step_in_epoch, after.fraction) == (3, 4, pytest.approx(1.0))
    summary = s.close("finished")
    assert (summary.epochs, summary.steps, summary.samples) == (3, 12, 36)


def test_an_iter_that_fetches_nothing_is_no_epoch_and_len_passes_through() -> None:
    s = session()
    loop = s.batches(BATCHES)
    assert len(loop) == 4
    iter(loop)  # tqdm's spare iter(): never advanced
    assert s.close("finished").epochs == 0


def test_next_batch_counts_a_step_and_its_samples() -> None:
    s = session()
    it = iter(BATCHES)
    s.next_batch(it)
    assert s.next_batch(iter(()), None) is None
    summary = s.close("finished")
    assert (summary.steps, summary.samples) == (2, 3)  # no signal at all: each fetch counts


def test_a_next_batch_that_no_step_follows_is_taken_back() -> None:
    # josiahdavis/tabular: each pass draws `next(iter(train))`, steps, then evaluates on
    # `next(iter(valid))` under no_grad; only the training fetches are steps
    s = session()
    for _ in range(3):
        train_on(s, s.next_batch(iter(BATCHES)))
        s.next_batch(iter([torch.ones(5, 2)]))  # validation: no backward, no step
    summary = s.close("finished")
    assert (summary.steps, summary.samples) == (3, 9)


def test_a_validation_next_batch_after_an_epochs_batch_loop_is_no_step() -> None:
    # an epoch's batch loop, then `next(iter(valid))` under no_grad: the next epoch's batches
    # bring signals before any next() fetch settles it, so the batch loop's start must
    s = session()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(12, 2)), 3)
    for _ in range(3):
        for (batch,) in s.batches(loader):
            train_on(s, batch)
        s.next_batch(iter([torch.ones(5, 2)]))  # validation: no backward, no step
    summary = s.close("finished")
    assert (summary.steps, summary.samples, summary.epochs) == (12, 36, 3)
    assert summary.samples_source == "loader"  # the taken-back fetch's guess does not count


def test_the_last_batch_closes_a_short_accumulation_window() -> None:
    s = session(accumulate=3)
    flags = [s.accumulation.last_batch for _ in s.batches(BATCHES)]
    assert flags == [False, False, False, True]
    assert s.accumulation.last_batch is False  # reset when the epoch ends


def test_a_pass_shown_from_its_first_batch_is_taken_back_only_if_that_batch_did_not_train() -> None:
    """After a trained epoch, a validation pass shows as the epoch in progress while its first
    batch runs and is taken back when that batch brings no signal; a pass whose first batch
    trains keeps its own length, whatever its later batches do."""
    s = session()
    for batch in s.batches(BATCHES):  # an epoch of 4 steps
        train_on(s, batch)
    during = []
    for batch in s.batches([torch.ones(3, 2)] * 3):  # validation: nothing trains
        during.append(s.progress())
        s._namespace["model"](batch)
    assert (during[0].epoch, during[0].steps_per_epoch) == (2, 3)  # shown from its first batch
    at = s.progress()
    assert (at.epoch, at.steps_per_epoch, at.step_in_epoch) == (1, 4, 4)  # taken back
    for i, batch in enumerate(s.batches([torch.ones(3, 2)] * 5)):  # only its first batch trains
        if i == 0:
            train_on(s, batch)
    at = s.progress()
    assert (at.epoch, at.steps_per_epoch, at.steps) == (2, 5, 5)
