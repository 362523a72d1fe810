"""
Gradient accumulation of a run (`--accumulate N`): the backward() calls since the last real
optimizer step, and whether the step that follows completes the window.

One object, held by the session (which counts and steps) and by the out-of-memory retry (which
winds the count back when a batch is redone as micro-batches), so neither writes the other's state.
"""

from __future__ import annotations


class Accumulation:
    """The pending-step counter and the window boundary of one run."""

    __slots__ = ("every", "last_batch", "pending")

    def __init__(self, every: int) -> None:
        self.every = every  # backward() calls per optimizer step (1: no accumulation)
        # backward() calls since the last real optimizer step. Read only where `every > 1` or
        # an out-of-memory split runs (which winds it back, and counts its last micro-batch):
        # the session's plain backward() and step() (`every == 1`) leave it alone.
        self.pending = 0
        self.last_batch = False  # the batch in progress is its epoch's last (a short window ends)

    @property
    def active(self) -> bool:
        return self.every > 1

    @property
    def mid_window(self) -> bool:
        """Gradients of earlier batches are summed in `.grad` and not yet applied."""
        return self.every > 1 and self.pending > 0

    def complete(self) -> bool:
        """Whether the optimizer step that follows is a real one."""
        return self.pending >= self.every or self.last_batch
