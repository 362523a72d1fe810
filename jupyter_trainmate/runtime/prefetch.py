"""
Prefetch batches so the training step does not wait for them.

- `CudaPrefetcher`: copies batch N+1 to the GPU on a side stream (created once per loader) while
  step N computes. The compute stream waits for the copy before using a batch, and each copied
  tensor is marked as used by the compute stream (`record_stream`), so the caching allocator does
  not hand its memory to the next copy while a kernel still reads it. Source tensors are pinned
  when the loader did not pin them (timm's PrefetchLoader is the reference design).
- `ThreadPrefetcher`: produces batches on a background thread into a bounded queue. It changes
  the order of draws from the global torch RNG when the dataset or sampler draws from it while
  the model does too (dropout), so it is opt-in (`--prefetch thread`), never a default.

Both are iterators that can be closed early (`close()`), and both re-raise, in the training
thread, an exception raised by the loader.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from typing import Any

import torch

from .batch import iter_tensors, map_tensors, to_device

_DONE = object()


class CudaPrefetcher:
    """Iterate `loader`, with each batch already on `device`, copied one step ahead."""

    def __init__(self, loader: Iterable[Any], device: torch.device) -> None:
        self._it = iter(loader)
        self._device = device
        self._stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        self._pin = not getattr(loader, "pin_memory", False)
        self._next: Any = _DONE
        self._preload()

    def _preload(self) -> None:
        try:
            batch = next(self._it)
        except StopIteration:
            self._next = _DONE
            return
        if self._pin:
            batch = map_tensors(batch, lambda t: t.pin_memory() if t.device.type == "cpu" else t)
        # The copy stream must not start before the compute stream has finished with the memory
        # it may reuse (the previous batch's tensors are freed there).
        self._stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self._stream):
            self._next = to_device(batch, self._device, non_blocking=True)

    def __iter__(self) -> CudaPrefetcher:
        return self

    def __next__(self) -> Any:
        if self._next is _DONE:
            raise StopIteration
        compute = torch.cuda.current_stream(self._device)
        compute.wait_stream(self._stream)
        batch = self._next
        for t in iter_tensors(batch):
            if t.is_cuda:
                t.record_stream(compute)
        self._preload()
        return batch

    def close(self) -> None:
        self._next = _DONE


class ThreadPrefetcher:
    """Iterate `loader` on a background thread, keeping up to `depth` batches ready."""

    def __init__(self, loader: Iterable[Any], depth: int = 2) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        # iter() runs here, in the caller's thread, as it would in the plain loop.
        self._it = iter(loader)
        self._thread = threading.Thread(
            target=self._produce, name="trainmate-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for batch in self._it:
                if not self._put(batch):
                    return
        except BaseException as exc:  # re-raised in the consumer's thread
            self._put(_Failure(exc))
            return
        self._put(_DONE)

    def __iter__(self) -> ThreadPrefetcher:
        return self

    def __next__(self) -> Any:
        if self._stop.is_set():
            raise StopIteration
        item = self._queue.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        return item

    def close(self) -> None:
        """Stop the producer thread (it finishes the batch it is making) and drop queued batches."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)

    def __del__(self) -> None:
        self._stop.set()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
