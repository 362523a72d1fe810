"""`jupyter_trainmate.bench()`: inference latency and throughput, measured the careful way.

Each row: eval mode, `torch.inference_mode`, a stated thread count, warm-up calls, then
`torch.utils.benchmark.Timer.blocked_autorange` (blocks of calls until `min_run_time` is spent;
the Timer synchronises CUDA). `torch.compile` compiles during the warm-up (its time reported
apart), and the graphs compiled inside the timed region are counted from torch._dynamo's counters:
a row that recompiled there is marked. onnxruntime runs the model exported by `export()` (or a
given `.onnx` file) on its CPU provider with the same thread count.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainmateError
from .bench_report import BenchReport, BenchRow
from .inputs import Example, eval_mode, make_example, run_reference
from .measure import Memory, describe, measure_calls, precision_unsupported, versions

if TYPE_CHECKING:
    from torch import nn

BACKENDS = ("eager", "compile", "onnxruntime")
PRECISIONS = ("fp32", "bf16", "fp16")
WARMUP_CALLS = 3


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
    threads = threads or torch.get_num_threads()
    inputs = make_example(model, example)
    run_reference(model, inputs)  # a one-line error now if the model does not run on it
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    memory = Memory(device)
    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="trainmate-bench-") as scratch:
        runners = _runners(model, inputs, backends, compile_mode, threads, onnx_path, scratch)
        for backend, runner in runners:
            for prec in precision:
                why = runner.unsupported(prec, device) if runner else NO_ONNXRUNTIME
                if runner is None or why:
                    rows += [BenchRow(backend, prec, b, skipped=why) for b in batch_sizes]
                    continue
                for size in batch_sizes:
                    rows.append(runner.measure(prec, inputs.repeated(size), min_run_time, memory))
    return BenchReport(
        rows=tuple(rows),
        device=describe(device),
        threads=threads,
        memory=memory.what,
        min_run_time=min_run_time,
        versions=versions(),
    )


def bench_onnx(
    path: str | os.PathLike[str],
    example: Any,
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    precision: Sequence[str] = ("fp32",),
    min_run_time: float = 0.5,
    threads: int | None = None,
) -> BenchReport:
    """Time an exported `.onnx` file in onnxruntime; `example` holds one tensor per input."""
    import torch

    from .deps import require

    require("onnxruntime")
    threads = threads or torch.get_num_threads()
    runner = _Onnxruntime(Path(path), threads)
    names = tuple(i.name for i in runner.session.get_inputs())
    tensors = tuple(example) if isinstance(example, list | tuple) else (example,)
    if len(tensors) != len(names):
        raise TrainmateError(
            f"{path} has {len(names)} input(s) ({', '.join(names)}): give as many examples, "
            f"not {len(tensors)}"
        )
    inputs = Example(tensors, {}, names)
    memory = Memory(torch.device("cpu"))
    rows: list[BenchRow] = []
    for prec in precision:
        why = runner.unsupported(prec, torch.device("cpu"))
        for size in batch_sizes:
            rows.append(
                BenchRow("onnxruntime", prec, size, skipped=why)
                if why
                else runner.measure(prec, inputs.repeated(size), min_run_time, memory)
            )
    return BenchReport(
        tuple(rows), describe(memory.device), threads, memory.what, min_run_time, versions()
    )


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

    def measure(
        self, precision: str, inputs: Example, min_run_time: float, memory: Memory
    ) -> BenchRow:
        import torch
        from torch._dynamo.utils import counters

        backend = "compile" if self.compiled else "eager"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        device_type = memory.device.type
        autocast = (
            torch.autocast(device_type, dtype=dtype)
            if dtype is not None
            else torch.autocast(device_type, enabled=False)
        )
        fn, args, kwargs = self.fn, inputs.args, inputs.kwargs

        def call() -> None:
            fn(*args, **kwargs)

        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with eval_mode(self.model), torch.inference_mode(), autocast:
                graphs = counters["stats"]["unique_graphs"]
                with _torch_internals_quiet():
                    started = time.perf_counter()
                    call()
                    first = time.perf_counter() - started
                    for _ in range(WARMUP_CALLS - 1):
                        call()
                warmup_graphs = counters["stats"]["unique_graphs"] - graphs
                memory.reset()
                graphs = counters["stats"]["unique_graphs"]
                timing = measure_calls(call, inputs.batch_size or 1, min_run_time, self.threads)
                recompiles = counters["stats"]["unique_graphs"] - graphs
        finally:
            torch.set_num_threads(previous)
        note = ""
        if self.compiled:
            note = f"{warmup_graphs} graph(s) compiled in warm-up"
            if recompiles:
                note = f"RECOMPILED {recompiles} time(s) in the timed region; " + note
        return BenchRow(
            backend,
            precision,
            inputs.batch_size or 1,
            peak_memory_mb=memory.peak_mb(),
            compile_s=(first if warmup_graphs else 0.0) if self.compiled else None,
            recompiles=recompiles if self.compiled else None,
            note=note,
            **asdict(timing),
        )


class _Onnxruntime:
    """onnxruntime's CPU provider on the exported model, feeds prepared before timing."""

    def __init__(self, path: Path, threads: int) -> None:
        from .parity import session

        self.session = session(path, threads)
        self.threads = threads

    def unsupported(self, precision: str, device: Any) -> str:
        if precision != "fp32":
            return f"{precision}: the exported model is fp32 (onnxruntime does not cast it)"
        if device.type != "cpu":
            return "the model is on a GPU: onnxruntime with the CUDA provider is not measured yet"
        return ""

    def measure(
        self, precision: str, inputs: Example, min_run_time: float, memory: Memory
    ) -> BenchRow:
        from .parity import feeds

        sess = self.session
        fed = feeds(sess, inputs)
        names = [o.name for o in sess.get_outputs()]

        def call() -> None:
            sess.run(names, fed)

        for _ in range(WARMUP_CALLS):
            call()
        memory.reset()
        timing = measure_calls(call, inputs.batch_size or 1, min_run_time, self.threads)
        return BenchRow(
            "onnxruntime",
            precision,
            inputs.batch_size or 1,
            peak_memory_mb=memory.peak_mb(),
            **asdict(timing),
        )


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
) -> list[tuple[str, Any]]:
    runners: list[tuple[str, Any]] = []
    for backend in backends:
        if backend == "onnxruntime":
            runners.append((backend, _onnx_runner(model, inputs, threads, onnx_path, scratch)))
        else:
            runners.append((backend, _Torch(model, backend == "compile", compile_mode, threads)))
    return runners


def _onnx_runner(
    model: nn.Module,
    inputs: Example,
    threads: int,
    onnx_path: str | os.PathLike[str] | None,
    scratch: str,
) -> _Onnxruntime | None:
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return None
    if onnx_path is None:
        from .export import export

        onnx_path = Path(scratch) / "model.onnx"
        export(model, inputs, onnx_path, batch_sizes=())
    return _Onnxruntime(Path(onnx_path), threads)


NO_ONNXRUNTIME = "onnxruntime is not installed: pip install 'jupyter_trainmate[export]'"
