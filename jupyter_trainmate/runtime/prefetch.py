"""
Prefetch batches so the training step does not wait for them.

- `CudaPrefetcher`: copies batch N+1 to the GPU on a side stream (created once per loader) while
  step N computes. The compute stream waits for the copy before using a batch, and each copied
  tensor is marked as used by the compute stream (`record_stream`), so the caching allocator does
  not hand its memory to the next copy while a kernel still reads it. Source tensors are pinned
  when the loader did not pin them (timm's PrefetchLoader is the reference design).
- `ThreadPrefetcher`: produces batches on a background thread into a bounded queue. It changes
  the order of draws from the global torch RNG when the dataset or sampler draws from it while
  the model does too (dropout), so `--prefetch thread` is opt-in; `--prefetch auto` uses a thread
  on the CPU only when `auto_thread` finds that loading waits and draws no random numbers.

Both are iterators that can be closed early (`close()`), and both re-raise, in the training
thread, an exception raised by the loader.
"""

from __future__ import annotations

import queue
import random
import statistics
import sys
import threading
import time
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

    def __init__(self, loader: Iterable[Any], depth: int = 2, *, started: bool = False) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        # iter() runs here, in the caller's thread, as it would in the plain loop (`started`:
        # `loader` is already an iterator the caller made).
        self._it = loader if started else iter(loader)
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


# -- `--prefetch auto` on the CPU: a thread when loading draws no random numbers ------------------

PROBE_SAMPLES = 4  # samples fetched and collated by the probe (they are fetched again in the run)
MIN_WAIT_S = 0.0002  # a batch that loads faster than this has nothing worth overlapping


def _rng_states() -> tuple[Any, ...]:
    """The global generators a dataset may draw from: torch's, Python's, NumPy's if imported."""
    numpy = sys.modules.get("numpy")
    return (
        torch.get_rng_state(),
        random.getstate(),
        numpy.random.get_state() if numpy is not None else None,
    )


def _set_rng_states(states: tuple[Any, ...]) -> None:
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    numpy = sys.modules.get("numpy")
    if numpy is not None and states[2] is not None:
        numpy.random.set_state(states[2])


def _changed(before: tuple[Any, ...], after: tuple[Any, ...]) -> str | None:
    """Which generator moved between two `_rng_states()` (None: none did)."""
    if not torch.equal(before[0], after[0]):
        return "torch"
    if before[1] != after[1]:
        return "Python's random"
    if before[2] is not None and after[2] is not None:
        a, b = before[2], after[2]
        if a[0] != b[0] or a[2:] != b[2:] or not (a[1] == b[1]).all():
            return "NumPy"
    return None


RESULTS_CHANGE = (
    "%%train --prefetch thread would overlap loading with compute, but the loader's random "
    "draws and the model's would interleave differently from run to run (results change)"
)


def auto_thread(loader: object) -> str | None:
    """Whether `--prefetch auto` loads this loader's batches on a thread: None when it does,
    else why not (the advice shows it).

    A thread must change no result, and it changes results only through random draws: the
    training thread draws too (dropout, the model's own sampling), and two threads drawing from
    one global generator interleave in an order that varies from run to run. So the probe
    fetches and collates a few samples, as the loader would, and checks that the global torch,
    Python and NumPy generators did not move; it also checks that the sampler draws only once per
    pass (at its first batch, which `FirstOnThisThread` fetches on the training thread). Every
    generator is put back as it was, so the probe itself changes nothing.

    A thread must also pay: it overlaps loading only where loading waits (files, the network)
    and lets go of the GIL; loading that is Python work on this thread would only take turns
    with the training step. So the probe times each sample's fetch in wall and thread CPU time,
    and a loader whose (low) median sample is mostly CPU work stays on the training thread. A DataLoader with workers
    (they load in other processes), an IterableDataset (it cannot be fetched without consuming
    it) and anything that is not a DataLoader (in-memory batches) stay there too.
    """
    if not isinstance(loader, torch.utils.data.DataLoader):
        return "not a DataLoader"
    if loader.num_workers > 0:
        return "its workers already load in other processes"
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return (
            "an IterableDataset cannot be probed without consuming it; --prefetch thread "
            "overlaps loading (results change only if loading draws random numbers)"
        )
    saved = _rng_states()
    try:
        indices: list[Any]
        if loader.batch_sampler is not None:
            order = iter(loader.batch_sampler)
            first = next(order, None)
            if first is None:
                return "it is empty"
            drawn = _rng_states()
            next(order, None)
            if _changed(drawn, _rng_states()):
                return f"its sampler draws random numbers at every batch; {RESULTS_CHANGE}"
            batch = len(first)
            indices = list(first)[:PROBE_SAMPLES]
        else:
            batch = 1
            indices = [next(iter(loader.sampler))]
        before = _rng_states()
        samples, walls, waits = [], [], []
        for i in indices:  # each sample timed apart: see below
            wall, cpu = time.perf_counter(), time.thread_time()
            samples.append(loader.dataset[i])
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            walls.append(wall)
            waits.append(wall - cpu)
        loader.collate_fn(samples if loader.batch_sampler is not None else samples[0])
        moved = _changed(before, _rng_states())
        if moved is not None:
            return f"fetching its samples draws random numbers ({moved}: augmentation?); {RESULTS_CHANGE}"
        # The low median sample: a loaded machine that takes the core away during the probe
        # makes a sample or two look like waiting; a loader that waits, waits at every sample.
        wall, waited = statistics.median_low(walls), statistics.median_low(waits)
        per_batch = wall * batch
        if waited < wall / 2 or per_batch < MIN_WAIT_S:
            return (
                f"its loading is CPU work on this thread (about {per_batch * 1e3:.2f} ms a batch): "
                "a thread would take turns with the step for the GIL; num_workers loads in parallel"
            )
        return None
    except Exception as error:  # a probe must never break the run: load as the plain loop does
        return f"the probe could not fetch a sample ({type(error).__name__})"
    finally:
        _set_rng_states(saved)


class FirstOnThisThread:
    """A thread prefetcher whose first batch is fetched on the training thread, when asked for.

    A sampler draws its order from the global generator at its first batch (RandomSampler does,
    lazily): fetched here, that draw keeps its place between the loop's `iter()` and its body,
    as in the plain loop (and its wait is timed as the first step's); the thread starts on the
    rest as the first batch is handed over.
    """

    def __init__(self, loader: Iterable[Any]) -> None:
        self._it = iter(loader)
        self._rest: ThreadPrefetcher | None = None
        self._closed = False

    def __iter__(self) -> FirstOnThisThread:
        return self

    def __next__(self) -> Any:
        if self._rest is not None:
            return next(self._rest)
        if self._closed:
            raise StopIteration
        batch = next(self._it)
        self._rest = ThreadPrefetcher(self._it, started=True)
        return batch

    def close(self) -> None:
        self._closed = True
        if self._rest is not None:
            self._rest.close()
