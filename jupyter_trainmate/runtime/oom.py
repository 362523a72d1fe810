"""
Out-of-memory recovery: retry a failed step as smaller micro-batches with the same effective batch.

The rewrite wraps the body of each batch loop (see `rewrite.loops`):

    for xb, yb in __trainmate__.batches(loader):
        for xb, yb in __trainmate__.parts((xb, yb), ("loss",)):
            try:
                <the loop body, unchanged>
            except __trainmate__.oom_errors:
                if not __trainmate__.oom_guard.caught(): raise

Normally `parts` yields the batch once and the `try` costs nothing (Python 3.11's exceptions
are free until raised; a `with` would call two methods per step). When the body raises
`torch.OutOfMemoryError`, `caught()` frees what the failed attempt held (the traceback's frames,
the body's variables that hold an autograd graph, every gradient, the CUDA cache) and swallows
the error; `parts` then yields the same batch split into 2, 4, 8, ... micro-batches. The session
treats them as gradient accumulation inside the step: gradients are zeroed before the first
micro-batch only, each micro-batch's loss is weighted by its share of the batch (so a mean-reduced
loss gives the full batch's gradient), and the optimizer steps after the last one. The split that
worked is kept for the rest of the run. Below one sample per micro-batch the run stops with a
clear message. Micro-batches see smaller BatchNorm batches: the only numerical change.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from types import TracebackType
from typing import Any

import torch

from ..errors import TrainmateError
from .accumulation import Accumulation
from .batch import batch_size

RetryPoint = tuple[tuple[str, ...], int, int, int, float]


@cache
def oom_possible() -> bool:
    """Whether torch can raise `torch.OutOfMemoryError` in this process: an accelerator is there.

    On the CPU alone a failed allocation is a plain RuntimeError, so the retry point would only
    cost every step a generator and a second loop. Decided once per process; none of these
    checks creates a CUDA context.
    """
    if torch.cuda.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and bool(xpu.is_available())


def wants_retry(mode: str) -> bool:
    """Whether the rewrite gives batch loops a retry point, for `--oom-retry MODE`."""
    return mode == "on" or (mode == "auto" and oom_possible())


def split_batch(batch: Any, size: int, parts: int) -> list[Any]:
    """`batch` cut into `parts` micro-batches along the leading dimension of length `size`.

    Tensors whose first dimension is `size` are split (views, no copies), lists of `size`
    non-tensor items (file names, raw strings) too; everything else is repeated in each part.
    """
    if isinstance(batch, torch.Tensor):
        if batch.dim() and batch.shape[0] == size:
            return list(batch.tensor_split(parts))
        return [batch] * parts
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        columns = [split_batch(item, size, parts) for item in batch]
        return [type(batch)(*row) for row in zip(*columns, strict=True)]
    if (
        isinstance(batch, list)
        and len(batch) == size > 1
        and not any(isinstance(item, torch.Tensor | list | tuple | Mapping) for item in batch)
    ):
        bounds = [len(t) for t in torch.arange(size).tensor_split(parts)]
        out, start = [], 0
        for n in bounds:
            out.append(batch[start : start + n])
            start += n
        return out
    if isinstance(batch, list | tuple):
        columns = [split_batch(item, size, parts) for item in batch]
        return (
            [type(batch)(row) for row in zip(*columns, strict=True)] if columns else [batch] * parts
        )
    if isinstance(batch, Mapping):
        split = {key: split_batch(value, size, parts) for key, value in batch.items()}
        rows = [{key: split[key][i] for key in split} for i in range(parts)]
        rebuild: Any = type(batch)
        try:
            return [rebuild(row) for row in rows]
        except TypeError:
            return rows
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = [f.name for f in dataclasses.fields(batch) if f.init]
        split = {name: split_batch(getattr(batch, name), size, parts) for name in fields}
        return [
            dataclasses.replace(batch, **{n: split[n][i] for n in fields}) for i in range(parts)
        ]
    return [batch] * parts


def _nothing() -> None:
    return None


class OutOfMemoryRetry:
    """The `parts()` generator and the `with` guard of one run (see the module docstring)."""

    def __init__(
        self,
        accumulation: Accumulation,
        *,
        steps: Callable[[], int],
        report: Callable[[str], None],
        drop_gradients: Callable[[], None],
    ) -> None:
        self._accumulation = accumulation
        self._steps = steps  # the run's step count, for messages
        self._report = report
        self._drop_gradients = drop_gradients
        self.parts_per_batch = 1  # the split that worked last; kept for the rest of the run
        self.index = 0  # which micro-batch of the current batch is running
        self.count = 1  # how many micro-batches the current batch runs as
        self.weight = 1.0  # the running micro-batch's share of the batch
        self._failed: str | None = None  # the error's message (the error itself holds frames)
        self._names: tuple[str, ...] = ()
        self._pending_at_start = 0
        # called when `count` or `index` may have changed (a split starts or ends, a batch loop
        # puts the outer batch's state back): the session picks its per-step calls again
        self.on_split: Callable[[], None] = _nothing

    @property
    def failed(self) -> bool:
        """Whether the attempt that just ran ended in out-of-memory (set by `__exit__`)."""
        return self._failed is not None

    @property
    def last_part(self) -> bool:
        return self.index >= self.count - 1

    def parts(self, batch: Any, names: tuple[str, ...] = ()) -> Iterator[Any]:
        # A generator: calling it runs nothing, and until an out-of-memory error its body is
        # two attribute stores, one yield and one test. (A C iterator over a one-item list that
        # `caught()` extends, tried for issue 14, costs more per step: a call and four objects.)
        self._names = names
        self._pending_at_start = self._accumulation.pending
        if self.parts_per_batch == 1:
            yield batch
            if self._failed is None:
                return
        yield from self._split(batch)

    def _split(self, batch: Any) -> Iterator[Any]:
        """The batch as micro-batches: `parts_per_batch` of them, more after each failure."""
        size = batch_size(batch)
        parts = self.parts_per_batch
        accumulation = self._accumulation
        try:
            while True:
                if self._failed is not None:
                    parts = self._more_parts(parts, size)
                    accumulation.pending = self._pending_at_start  # the batch is redone
                self._failed = None
                pieces = split_batch(batch, size, min(parts, size) if size else 1)
                self.count = len(pieces)
                self.on_split()
                for self.index, piece in enumerate(pieces):
                    self.weight = batch_size(piece) / size if size else 1 / self.count
                    yield piece
                    if self.failed:  # set by `caught()` while the piece ran
                        break
                else:
                    self.parts_per_batch = parts
                    return
        finally:
            self.index, self.count, self.weight = 0, 1, 1.0
            self._failed = None
            self.on_split()

    def retry_point(self) -> RetryPoint:
        """The state of the batch in progress: what its body assigns, the pending count it
        started with, the micro-batch running. A batch loop takes it when it starts and puts it
        back when it ends, so a batch loop run from a batch's body (a notebook function's)
        leaves the outer batch's micro-batches as they were."""
        return self._names, self._pending_at_start, self.index, self.count, self.weight

    def restore(self, point: RetryPoint) -> None:
        self._names, self._pending_at_start, self.index, self.count, self.weight = point
        self.on_split()
        # A failure is consumed by the generator that retries it; none is left when a batch
        # loop ends (one left by an interrupted retry must not split the next batch).
        self._failed = None

    def _more_parts(self, parts: int, size: int) -> int:
        error = self._failed
        if size <= 1 or parts >= size:
            raise TrainmateError(
                f"out of memory at step {self._steps()} even with micro-batches "
                f"of 1 sample: make the model or the input smaller ({error})"
            )
        more = min(parts * 2, size)
        per = -(-size // more)
        self._report(
            f"out of memory at step {self._steps()}: the batch of {size} now "
            f"runs as {more} micro-batches of {per} (same effective batch)"
        )
        return more

    def caught(self) -> bool:
        """In the retry point's `except` clause: whether the error being handled is retried
        (False: the clause re-raises it)."""
        kind, error, tb = sys.exc_info()
        try:
            return self.__exit__(kind, error, tb)
        finally:
            del error, tb

    def __enter__(self) -> None:  # `with oom_guard:` (code rewritten before the `try` form)
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if kind is None or not issubclass(kind, torch.OutOfMemoryError):
            return False
        if self._accumulation.active and self._pending_at_start > 0:
            # Gradients of earlier batches of the window are summed in .grad with this one's
            # partial ones: they cannot be told apart, so the step cannot be redone.
            self._report("out of memory inside an --accumulate window: the step cannot be retried")
            return False
        assert error is not None
        self._failed = str(error).splitlines()[0] if str(error) else type(error).__name__
        self._free(error, tb)
        return True

    def _free(self, error: BaseException, tb: TracebackType | None) -> None:
        """Drop what the failed attempt still holds, so the retry has the memory back."""
        if tb is not None:
            frame = tb.tb_frame
            if frame.f_locals is frame.f_globals:  # module level (a cell): its variables
                scope = frame.f_globals
                for name in self._names:
                    value = scope.get(name)
                    if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                        del scope[name]  # holds the failed step's graph; the body assigns it again
            if tb.tb_next is not None:
                traceback.clear_frames(tb.tb_next)  # the model's frames: activations
        error.__traceback__ = None
        self._drop_gradients()
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()
