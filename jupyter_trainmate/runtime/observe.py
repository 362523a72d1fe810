"""backward() calls the rewrite could not route, observed for the run.

`%%train` routes the `loss.backward()` calls it rewrites (in the cell and in the notebook's
functions it reaches) through the session: counted, the loss kept for the display and the
status file, guarded, scaled. A loop whose backward() runs where no rewrite reaches it, in a
step closure made before the cell (`train_step = make_train_step(model, loss_fn, opt)`) or in a
function of an imported module (`engine.train_one_epoch(...)`), trained with no loss seen: an
empty loss curve, and a sweep monitoring the loss failed every trial. When the rewrite routed no
backward() at all, `Tensor.backward` is wrapped for the run (and put back after it) so that each
call on the training thread is reported to the session first: counted and its loss kept as a
routed one's, and nothing else done (no guard, scaler or accumulation applies to a call the
loop makes itself). A run whose backward() calls are routed pays nothing: the wrapper is not
installed.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch


def observe_backwards(report: Callable[[torch.Tensor], None]) -> Callable[[], None]:
    """Wrap `torch.Tensor.backward` so that each call on this thread first calls `report` with
    the tensor; returns the undo (which puts the original back unless someone replaced ours)."""
    original = torch.Tensor.backward
    thread = threading.get_ident()

    @functools.wraps(original)
    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython shows the caller's line and torch's, not this frame
        if threading.get_ident() == thread:
            report(self)
        return original(self, *args, **kwargs)  # type: ignore[no-untyped-call]

    torch.Tensor.backward = backward  # type: ignore[method-assign]

    def undo() -> None:
        if torch.Tensor.backward is backward:
            torch.Tensor.backward = original  # type: ignore[method-assign]

    return undo
