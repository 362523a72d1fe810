"""`jupyter_trainmate.bench()`: inference latency and throughput, measured the careful way.

Each row: eval mode, `torch.inference_mode`, a stated thread count, warm-up calls; then every
row is timed in rounds (`measure.measure_rounds`: `torch.utils.benchmark.Timer`, blocks of calls,
each round a share of `min_run_time` per row, the rows interleaved; the Timer synchronises CUDA)
on the wall clock or, with `clock="cpu"`, the calling thread's CPU time on one thread.
`torch.compile` compiles during the warm-up (its time reported apart), and the graphs compiled
inside the timed region are counted from torch._dynamo's counters: a row that recompiled there is
marked. onnxruntime runs the model exported by `export()` (or a given `.onnx` file) with the same
thread count, on the CPU provider (the CUDA provider for a model on a GPU), its inputs and
outputs bound once (I/O binding, `binding.py`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainmateError
from .bench_report import BenchReport, BenchRow
from .inputs import Example, eval_mode, make_example, run_reference
from .measure import (
    CLOCKS,
    Memory,
    Timing,
    busy_note,
    describe,
    measure_rounds,
    precision_unsupported,
    versions,
)

if TYPE_CHECKING:
    from torch import nn

BACKENDS = ("eager", "compile", "onnxruntime")
PRECISIONS = ("fp32", "bf16", "fp16")
WARMUP_CALLS = 3
ROUNDS = 5


def bench(
    model: nn.Module,
    example: Any,
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    precision: Sequence[str] = ("fp32", "bf16"),
    backends: Sequence[str] = BACKENDS,
    min_run_time: float = 0.5,
    threads: int | None = None,
    onnx_path: str | os.PathLike[str] | None = None,
    compile_mode: str | None = None,
    io_binding: bool = True,
    rounds: int = ROUNDS,
    clock: str = "wall",
) -> BenchReport:
    """Time `model` on `example` resized to each batch size; see `BenchReport`."""
    import torch

    for name, given, choices in (
        ("backend", backends, BACKENDS),
        ("precision", precision, PRECISIONS),
    ):
        bad = [g for g in given if g not in choices]
        if bad:
            raise TrainmateError(f"unknown {name} {bad[0]!r}: choose from {', '.join(choices)}")
    if not batch_sizes or min(batch_sizes) < 1:
        raise TrainmateError("batch sizes are whole numbers >= 1")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    threads = _threads(threads, clock, rounds, device)
    inputs = make_example(model, example)
    run_reference(model, inputs)  # a one-line error now if the model does not run on it
    memory = Memory(device)
    planned: list[BenchRow | _Prepared] = []
    with tempfile.TemporaryDirectory(prefix="trainmate-bench-") as scratch:
        runners = _runners(
            model, inputs, backends, compile_mode, threads, onnx_path, scratch, device, io_binding
        )
        for backend, runner in runners:
            for prec in precision:
                why = runner.unsupported(prec, device) if runner else NO_ONNXRUNTIME
                if runner is None or why:
                    planned += [BenchRow(backend, prec, b, skipped=why) for b in batch_sizes]
                    continue
                for size in batch_sizes:
                    planned.append(runner.prepare(prec, inputs.repeated(size)))
        rows = _timed(planned, min_run_time, rounds, threads, clock, memory)
    return BenchReport(
        rows=tuple(rows),
        device=describe(device),
        threads=threads,
        memory=memory.what,
        min_run_time=min_run_time,
        versions=versions(),
        clock=clock,
        rounds=rounds,
        busy=busy_note(clock),
    )


def bench_onnx(
    path: str | os.PathLike[str],
    example: Any,
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    precision: Sequence[str] = ("fp32",),
    min_run_time: float = 0.5,
    threads: int | None = None,
    io_binding: bool = True,
    rounds: int = ROUNDS,
    clock: str = "wall",
) -> BenchReport:
    """Time an exported `.onnx` file in onnxruntime (CPU); `example` holds one tensor per input."""
    import torch

    from .deps import require

    require("onnxruntime")
    device = torch.device("cpu")
    threads = _threads(threads, clock, rounds, device)
    runner = _Onnxruntime(Path(path), threads, io_binding=io_binding)
    names = tuple(i.name for i in runner.session.get_inputs())
    tensors = tuple(example) if isinstance(example, list | tuple) else (example,)
    if len(tensors) != len(names):
        raise TrainmateError(
            f"{path} has {len(names)} input(s) ({', '.join(names)}): give as many examples, "
            f"not {len(tensors)}"
        )
    inputs = Example(tensors, {}, names)
    memory = Memory(device)
    planned: list[BenchRow | _Prepared] = []
    for prec in precision:
        why = runner.unsupported(prec, device)
        for size in batch_sizes:
            planned.append(
                BenchRow("onnxruntime", prec, size, skipped=why)
                if why
                else runner.prepare(prec, inputs.repeated(size))
            )
    rows = _timed(planned, min_run_time, rounds, threads, clock, memory)
    return BenchReport(
        tuple(rows),
        describe(memory.device),
        threads,
        memory.what,
        min_run_time,
        versions(),
        clock=clock,
        rounds=rounds,
        busy=busy_note(clock),
    )


def _threads(threads: int | None, clock: str, rounds: int, device: Any) -> int:
    """The thread count to measure with; one-line errors for a clock or rounds that cannot be."""
    import torch

    if clock not in CLOCKS:
        raise TrainmateError(f"unknown clock {clock!r}: choose from {', '.join(CLOCKS)}")
    if rounds < 1:
        raise TrainmateError(f"rounds {rounds}: a whole number >= 1")
    if clock == "cpu":
        if device.type != "cpu":
            raise TrainmateError(
                "clock cpu: a GPU's work is not the calling thread's CPU time; use clock wall"
            )
        if threads not in (None, 1):
            raise TrainmateError(
                f"clock cpu measures the calling thread only: it needs 1 thread, not {threads}"
            )
        return 1
    return threads or torch.get_num_threads()


class _Prepared:
    """One row, warm, ready for `measure_rounds`; `finish` makes its `BenchRow`."""

    def __init__(
        self,
        batch: int,
        call: Callable[[], None],
        context: Callable[[], contextlib.AbstractContextManager[None]],
        finish: Callable[[Timing, float | None], BenchRow],
    ) -> None:
        self.batch = batch
        self.call = call
        self._context = context
        self.finish = finish

    def context(self) -> contextlib.AbstractContextManager[None]:
        return self._context()


def _timed(
    planned: list[BenchRow | _Prepared],
    min_run_time: float,
    rounds: int,
    threads: int,
    clock: str,
    memory: Memory,
) -> list[BenchRow]:
    """The rows in their planned order, the prepared ones timed together in rounds."""
    prepared = [p for p in planned if isinstance(p, _Prepared)]
    timings = iter(measure_rounds(prepared, min_run_time, rounds, threads, clock, memory))
    return [p if isinstance(p, BenchRow) else p.finish(*next(timings)) for p in planned]


class _Torch:
    """Eager or compiled PyTorch; bf16/fp16 through autocast (the model itself is not cast)."""

    def __init__(self, model: nn.Module, compiled: bool, mode: str | None, threads: int) -> None:
        import torch

        self.model = model
        self.compiled = compiled
        with _torch_internals_quiet():
            self.fn = torch.compile(model, mode=mode) if compiled else model
        self.threads = threads

    def unsupported(self, precision: str, device: Any) -> str:
        return precision_unsupported(precision, device)

    def prepare(self, precision: str, inputs: Example) -> _Prepared:
        import torch
        from torch._dynamo.utils import counters

        backend = "compile" if self.compiled else "eager"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        device_type = next(
            (p.device.type for p in self.model.parameters()), torch.device("cpu").type
        )
        fn, args, kwargs = self.fn, inputs.args, inputs.kwargs
        recompiles = 0

        def call() -> None:
            fn(*args, **kwargs)

        @contextlib.contextmanager
        def context() -> Iterator[None]:
            nonlocal recompiles
            autocast = (
                torch.autocast(device_type, dtype=dtype)
                if dtype is not None
                else torch.autocast(device_type, enabled=False)
            )
            previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                with eval_mode(self.model), torch.inference_mode(), autocast:
                    graphs = counters["stats"]["unique_graphs"]
                    yield
                    recompiles += counters["stats"]["unique_graphs"] - graphs
            finally:
                torch.set_num_threads(previous)

        with context(), _torch_internals_quiet():
            started = time.perf_counter()
            call()
            first = time.perf_counter() - started
            for _ in range(WARMUP_CALLS - 1):
                call()
        warmup_graphs, recompiles = recompiles, 0
        batch = inputs.batch_size or 1

        def finish(timing: Timing, peak: float | None) -> BenchRow:
            note = ""
            if self.compiled:
                note = f"{warmup_graphs} graph(s) compiled in warm-up"
                if recompiles:
                    note = f"RECOMPILED {recompiles} time(s) in the timed region; " + note
            return BenchRow(
                backend,
                precision,
                batch,
                peak_memory_mb=peak,
                compile_s=(first if warmup_graphs else 0.0) if self.compiled else None,
                recompiles=recompiles if self.compiled else None,
                note=note,
                **asdict(timing),
            )

        return _Prepared(batch, call, context, finish)


class _Onnxruntime:
    """onnxruntime on the exported model: the CPU provider, or the CUDA provider for a model on a
    GPU (`onnxruntime-gpu`); inputs and outputs bound once on the provider's device (I/O binding,
    `binding.py`) unless `io_binding` is False, feeds prepared before timing."""

    def __init__(
        self, path: Path, threads: int, device: Any = None, io_binding: bool = True
    ) -> None:
        import onnxruntime as ort

        from .parity import session

        self.device_type = "cuda" if device is not None and device.type == "cuda" else "cpu"
        self.device_id = (device.index or 0) if self.device_type == "cuda" else 0
        self.missing = ""
        providers: list[Any] = ["CPUExecutionProvider"]
        if self.device_type == "cuda":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": self.device_id}))
            else:
                self.missing = NO_CUDA_PROVIDER
        self.session = session(path, threads, providers)
        self.threads = threads
        self.io_binding = io_binding

    def unsupported(self, precision: str, device: Any) -> str:
        if precision != "fp32":
            return f"{precision}: the exported model is fp32 (onnxruntime does not cast it)"
        return self.missing

    def prepare(self, precision: str, inputs: Example) -> _Prepared:
        from .binding import Bound
        from .parity import feeds

        sess = self.session
        fed = feeds(sess, inputs)
        names = [o.name for o in sess.get_outputs()]
        call: Callable[[], None]
        if self.io_binding:
            call = Bound(sess, fed, self.device_type, self.device_id).run
        else:

            def call() -> None:
                sess.run(names, fed)

        for _ in range(WARMUP_CALLS):
            call()
        note = "CUDA provider" if self.device_type == "cuda" else "CPU provider"
        note += ", I/O binding" if self.io_binding else ""
        if self.device_type == "cuda":  # its arena is not torch's allocator
            note += "; peak memory: torch's allocator only"
        batch = inputs.batch_size or 1

        def finish(timing: Timing, peak: float | None) -> BenchRow:
            return BenchRow(
                "onnxruntime", precision, batch, peak_memory_mb=peak, note=note, **asdict(timing)
            )

        return _Prepared(batch, call, contextlib.nullcontext, finish)


@contextlib.contextmanager
def _torch_internals_quiet() -> Iterator[None]:
    """torch.compile's imports and first calls warn about torch's own deprecated internals."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _runners(
    model: nn.Module,
    inputs: Example,
    backends: Sequence[str],
    compile_mode: str | None,
    threads: int,
    onnx_path: str | os.PathLike[str] | None,
    scratch: str,
    device: Any,
    io_binding: bool,
) -> list[tuple[str, Any]]:
    runners: list[tuple[str, Any]] = []
    for backend in backends:
        if backend == "onnxruntime":
            runner = _onnx_runner(model, inputs, threads, onnx_path, scratch, device, io_binding)
            runners.append((backend, runner))
        else:
            runners.append((backend, _Torch(model, backend == "compile", compile_mode, threads)))
    return runners


def _onnx_runner(
    model: nn.Module,
    inputs: Example,
    threads: int,
    onnx_path: str | os.PathLike[str] | None,
    scratch: str,
    device: Any,
    io_binding: bool,
) -> _Onnxruntime | None:
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return None
    if onnx_path is None:
        from .export import export

        onnx_path = Path(scratch) / "model.onnx"
        export(model, inputs, onnx_path, batch_sizes=())
    return _Onnxruntime(Path(onnx_path), threads, device, io_binding)


NO_ONNXRUNTIME = "onnxruntime is not installed: pip install 'jupyter_trainmate[export]'"
NO_CUDA_PROVIDER = (
    "the model is on a GPU and this onnxruntime has no CUDA provider: pip install onnxruntime-gpu"
)
