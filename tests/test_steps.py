"""Issue 14, round 3: a batch loop run from a batch's body leaves the outer batch's retry and
micro-batches as they were; the display thread, started without waiting for it, still stops
before the run's teardown goes on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from jupyter_trainmate.display import live
from jupyter_trainmate.runtime.options import parse_options
from jupyter_trainmate.runtime.session import TrainSession

from .train_harness import (
    COMMON,
    REFUSE_BIG_BATCHES,
    assert_retried_as_micro_batches,
    run,
)

WARM_UP = """
warm_batches = [(x[:16], y[:16])]
def warm_up():
    for wx, wy in warm_batches:  # a batch loop of its own, with its own retry point
        loss_fn(model(wx), wy).backward()
"""
NESTED_LOOP = """
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        warm_up()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
"""


def test_out_of_memory_after_a_nested_batch_loop_retries_the_outer_batch() -> None:
    """The step fails after a batch loop in a notebook function its body calls ran (that loop
    has its own retry point): the outer batch is still redone as micro-batches, and the split
    is kept for the rest of the run."""
    cells = [COMMON + WARM_UP + REFUSE_BIG_BATCHES, NESTED_LOOP]
    ip = run(cells, "--oom-retry on --display off")
    assert_retried_as_micro_batches(ip)


def test_halt_waits_for_a_display_thread_inside_its_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The display thread starts without `threading.Thread.start()`'s wait; `halt()` still ends
    a thread that is running its loop before it returns (the status file is removed after)."""
    monkeypatch.setattr(live, "REFRESH_S", 0.001)
    session = TrainSession(parse_options("--display off"), {})
    display = live.LiveDisplay(session, mode="off")
    ticked = threading.Event()
    ended = []

    def tick(*args: Any) -> Any:
        ticked.set()
        return args[1]

    def loop(original: Callable[[], None] = display._loop) -> None:
        original()
        ended.append(True)

    monkeypatch.setattr(display, "tick", tick)
    monkeypatch.setattr(display, "_loop", loop)
    display.start()
    assert ticked.wait(30)
    display.halt()
    assert ended == [True]
    assert not display._life.locked()
    display.halt()  # again (finish() halts after the runner did): returns at once


def test_halt_before_the_display_thread_began_leaves_it_nothing_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = TrainSession(parse_options("--display off"), {})
    display = live.LiveDisplay(session, mode="off")
    looped = []
    monkeypatch.setattr(display, "_loop", lambda: looped.append(True))
    display.halt()  # the run ended before the thread was started (or scheduled)
    display._main()  # what the thread runs when it begins: it sees the stop
    assert looped == []


def test_the_per_step_calls_check_nothing_the_run_fixed_and_everything_during_a_split() -> None:
    """`backward`, `zero_grad`, `step` are the plain forms when the options leave nothing to
    decide, the general ones with accumulation, and the general ones while an out-of-memory
    split runs (back to plain when it ends)."""
    import torch

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    namespace = {"model": model, "opt": opt}
    session = TrainSession(parse_options("", None), namespace)
    plain = (session._backward_plain, session._zero_grad_plain, session._step_plain)
    assert (session.backward, session.zero_grad, session.step) == plain
    accumulating = TrainSession(parse_options("--accumulate 2", None), namespace)
    assert accumulating.backward == accumulating._backward_any
    assert accumulating.zero_grad == accumulating._zero_grad_any
    assert accumulating.step == accumulating._step_any
    retry = session.oom_guard
    retry.parts_per_batch = 2
    split = retry.parts(torch.ones(4, 2))
    next(split)  # the first micro-batch is running
    assert (session.backward, session.zero_grad, session.step) == (
        session._backward_any,
        session._zero_grad_any,
        session._step_any,
    )
    for _ in split:
        pass
    assert (session.backward, session.zero_grad, session.step) == plain
    session.monitor_epoch_loss()  # a sweep's --monitor loss: every backward() reads the loss
    assert session.backward == session._backward_any
