"""The per-step cost of the calls `%%train`'s rewritten loop makes, in nanoseconds per step.

CPU path: each part of the step path (the batch wrapper with its timing, the retry point, the
`zero_grad`/`backward`/`step` dispatch with the optimizer step hook, guards off) runs N times
against a loop making the same plain calls, and the whole rewritten loop (the real rewrite of a
training loop as a default run makes it here, executed with a real `TrainSession`) against the plain loop. The calls themselves
are made cheap on purpose (an optimizer subclass whose step does nothing, a loss whose backward
does nothing) so what is left is `%%train`'s own cost. Times are CPU time of the thread
(`time.thread_time`), not wall time: the development machine is shared and loaded; each figure
is the median over R alternating (plain, `%%train`) pairs of (train - plain) / N.

CUDA path (no GPU needed): the CUDA calls the run makes per step (events, stream waits,
`record_stream`), counted by replacing them with counters, for a run on `cuda` with the default
`--prefetch auto` (a side-stream copy).

    python benchmarks/step_path.py [N] [R]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jupyter_trainmate.rewrite import compile_rewritten, rewrite_cell
from jupyter_trainmate.runtime import device as device_module
from jupyter_trainmate.runtime import prefetch as prefetch_module
from jupyter_trainmate.runtime import timing as timing_module
from jupyter_trainmate.runtime.oom import wants_retry
from jupyter_trainmate.runtime.options import parse_options
from jupyter_trainmate.runtime.session import TrainSession

LOOP = """
for xb, yb in data:
    opt.zero_grad()
    loss = forward(xb, yb)
    loss.backward()
    opt.step()
"""


class NullLoss(torch.Tensor):
    """A loss whose backward does nothing (the session checks `isinstance(loss, Tensor)`)."""

    def backward(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        return None


class NullOptimizer(torch.optim.Optimizer):
    """An optimizer whose step does nothing; torch still wraps `step` with its hook runner."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1, requires_grad=True)], {"lr": 0.0})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


def _namespace(steps: int) -> dict[str, Any]:
    loss = torch.zeros(()).as_subclass(NullLoss)
    data = [(torch.zeros(4, 2), torch.zeros(4)) for _ in range(steps)]
    return {"data": data, "opt": NullOptimizer(), "forward": lambda x, y: loss, "loss": loss}


def _session(namespace: dict[str, Any], line: str = "") -> TrainSession:
    facts = rewrite_cell(LOOP, namespace).merged_facts()
    return TrainSession(parse_options(line), namespace, own_amp=facts.own_amp, saw_backward=True)


@contextlib.contextmanager
def _running(session: TrainSession) -> Iterator[None]:
    session.start()  # the optimizer step hook, autocast (off on the CPU)
    try:
        yield
    finally:
        session.close("completed")


def _paired(plain: Callable[[], None], train: Callable[[], None], n: int, repeats: int) -> float:
    """Median over alternating pairs of (train - plain) CPU time, in ns per step."""
    diffs = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        plain()
        t1 = time.thread_time_ns()
        train()
        t2 = time.thread_time_ns()
        diffs.append(((t2 - t1) - (t1 - t0)) / n)
    return statistics.median(diffs)


def _exec(code: Any, namespace: dict[str, Any]) -> Callable[[], None]:
    return lambda: exec(code, namespace)


def parts(n: int, repeats: int) -> dict[str, float]:
    """ns per step of each part of the step path, and of the whole rewritten loop."""
    ns = _namespace(n)
    session = _session(ns)
    ns["__trainmate__"] = session
    result: dict[str, float] = {}
    plain_empty = compile("for xb, yb in data:\n    pass\n", "<plain>", "exec")
    snippets = {
        "batch wrapper (iteration, timing, counts)": (
            plain_empty,
            "for xb, yb in __trainmate__.batches(data):\n    pass\n",
        ),
        "retry point (parts + guard)": (plain_empty, None),  # filled from the rewrite below
        "zero_grad dispatch": (
            "for xb, yb in data:\n    opt.zero_grad()\n",
            "for xb, yb in data:\n    __trainmate__.zero_grad(opt)\n",
        ),
        "backward dispatch (guards off)": (
            "for xb, yb in data:\n    loss.backward()\n",
            "for xb, yb in data:\n    __trainmate__.backward(loss)\n",
        ),
        "step dispatch + optimizer step hook": (
            "for xb, yb in data:\n    opt.step()\n",
            "for xb, yb in data:\n    __trainmate__.step(opt)\n",
        ),
    }
    rewritten = rewrite_cell(LOOP, ns, retry=wants_retry("auto")).code  # as a default run
    # The retry point as the rewrite emits it (where there is one: an accelerator, or
    # `--oom-retry on`), around an empty body, over the plain list.
    retry_only = rewrite_cell("for xb, yb in data:\n    loss.backward()\n", ns, retry=True).code
    retry_only = retry_only.replace("__trainmate__.batches(data)", "data").replace(
        "__trainmate__.backward(loss)", "pass"
    )
    snippets["retry point (parts + guard)"] = (plain_empty, retry_only)
    for name, (plain_src, train_src) in snippets.items():
        assert train_src is not None
        plain_code = (
            plain_src if not isinstance(plain_src, str) else compile(plain_src, "<plain>", "exec")
        )
        train_code = compile_rewritten(train_src, train_src, "<train>")
        with _running(session):
            result[name] = _paired(_exec(plain_code, ns), _exec(train_code, ns), n, repeats)
    whole_plain = compile(LOOP, "<plain>", "exec")
    whole_train = compile_rewritten(rewritten, LOOP, "<train>")
    with _running(session):
        result["whole step (rewritten loop)"] = _paired(
            _exec(whole_plain, ns), _exec(whole_train, ns), n, repeats
        )
    return result


REAL_SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
batches = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(STEPS)]
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
"""
REAL_LOOP = """
for xb, yb in batches:
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
"""


def in_a_real_step(steps: int, repeats: int) -> dict[str, float]:
    """The batch wrapper and the whole step path around a real small step (the train_overhead
    model: a 64-128-10 MLP, batch 64): the step evicts the wrapper's code and objects from the
    caches, so each part costs several times its tight-loop figure. ns per step."""
    ns: dict[str, Any] = {}
    exec(REAL_SETUP.replace("STEPS", str(steps)), ns)
    session = _session(ns)
    ns["__trainmate__"] = session
    result = {}
    plain = compile(REAL_LOOP, "<plain>", "exec")
    wrapped = REAL_LOOP.replace("in batches", "in __trainmate__.batches(batches)")
    rewritten = rewrite_cell(REAL_LOOP, ns, retry=wants_retry("auto")).code
    with _running(session):
        result["batch wrapper (iteration, timing, counts)"] = _paired(
            _exec(plain, ns), _exec(compile(wrapped, "<train>", "exec"), ns), steps, repeats
        )
        result["whole step (rewritten loop)"] = _paired(
            _exec(plain, ns),
            _exec(compile_rewritten(rewritten, REAL_LOOP, "<train>"), ns),
            steps,
            repeats,
        )
    return result


# -- CUDA calls, counted -------------------------------------------------------------------------


class _Calls(Counter[str]):
    pass


def _counting_cuda(calls: _Calls) -> contextlib.ExitStack:
    """Replace the CUDA calls of the timing and the prefetcher with counters (no GPU needed)."""

    class Event:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls["Event()"] += 1

        def record(self, *args: Any) -> None:
            calls["Event.record"] += 1

        def query(self) -> bool:
            calls["Event.query"] += 1
            return True

        def synchronize(self) -> None:
            calls["Event.synchronize"] += 1

        def elapsed_time(self, other: Any) -> float:
            calls["Event.elapsed_time"] += 1
            return 0.1

    class Stream:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls["Stream()"] += 1

        def wait_stream(self, other: Any) -> None:
            calls["Stream.wait_stream"] += 1

    class CudaTensor:
        is_cuda = True

        def record_stream(self, stream: Any) -> None:
            calls["Tensor.record_stream"] += 1

    real_iter = prefetch_module.iter_tensors

    def iter_tensors(batch: Any) -> Iterator[Any]:
        for _ in real_iter(batch):
            yield CudaTensor()

    def current_stream(*args: Any) -> Stream:
        calls["current_stream"] += 1
        return stream

    stream = Stream()
    calls.clear()
    stack = contextlib.ExitStack()
    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, "Event", Event),
        (torch.cuda, "Stream", Stream),
        (torch.cuda, "current_stream", current_stream),
        (torch.cuda, "stream", lambda s: contextlib.nullcontext()),
        (prefetch_module, "iter_tensors", iter_tensors),
        (prefetch_module, "to_device", lambda batch, device, non_blocking=False: batch),
        (prefetch_module, "map_tensors", lambda batch, fn: batch),
    ]
    for owner, name, value in patches:
        old = getattr(owner, name)
        setattr(owner, name, value)
        stack.callback(setattr, owner, name, old)
    assert timing_module.torch is torch
    return stack


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def cuda_calls(steps: int = 1000) -> dict[str, float]:
    """CUDA calls per step on the CUDA path, counted (a run on `cuda`, default prefetch)."""
    calls = _Calls()
    ns = _namespace(steps)
    with _counting_cuda(calls), _patched(device_module, "params_device", lambda ns: None):
        session = TrainSession(parse_options("--device cuda --amp off"), ns, saw_backward=True)
        ns["__trainmate__"] = session
        code = compile_rewritten(rewrite_cell(LOOP, ns, retry=True).code, LOOP, "<train>")
        calls.clear()
        session.start()
        try:
            exec(code, ns)
            for _ in range(8):  # the display's reads of the run, a few times
                session.progress()
        finally:
            during = dict(calls)
            session.close("completed")
    return {name: count / steps for name, count in sorted(during.items())}


def main(n: int = 20000, repeats: int = 15) -> dict[str, Any]:
    torch.set_num_threads(1)
    figures = parts(n, repeats)
    print(
        f"step path, CPU: ns per step over plain calls (thread CPU time, median of {repeats} pairs of {n} steps)"
    )
    for name, value in figures.items():
        print(f"  {name:45s} {value:8.0f} ns")
    real = in_a_real_step(500, max(repeats * 2, 21))
    print(
        f"in a real step (64-128-10 MLP, batch 64; median of {max(repeats * 2, 21)} pairs of 500 steps)"
    )
    for name, value in real.items():
        print(f"  {name:45s} {value:8.0f} ns")
    counted = cuda_calls()
    print("step path, CUDA (counted, not timed): CUDA calls per step, default options")
    for name, value in counted.items():
        print(f"  {name:45s} {value:8.3f}")
    return {"cpu_ns": figures, "real_step_ns": real, "cuda_calls": counted}


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
