"""Parity: the ONNX model in onnxruntime against the PyTorch model in eval mode.

The example and random inputs at batch sizes 1, 3 and 8 (which proves the batch axis is really
dynamic) run in both; each output's largest absolute and relative differences are compared with
the tolerance `|onnx - torch| <= atol + rtol * |torch|` (numpy's `isclose`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainmateError
from .inputs import Example, first_line, run_reference
from .report import ParityRow

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime
    import torch
    from torch import nn


def session(
    path: Path, threads: int | None = None, providers: Sequence[Any] = ("CPUExecutionProvider",)
) -> onnxruntime.InferenceSession:
    """An onnxruntime session, by default on the CPU provider (quiet: errors only)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=list(providers))
    except Exception as exc:
        raise TrainmateError(f"onnxruntime cannot load {path}: {first_line(exc)}") from None


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor on any device and of any dtype as numpy (bf16/fp16 widened to float32)."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()
    return tensor.numpy()


def feeds(sess: onnxruntime.InferenceSession, example: Example) -> dict[str, np.ndarray]:
    """The example's tensors as onnxruntime inputs, by name (those the graph kept)."""
    tensors = dict(example.leaves())
    wanted = [i.name for i in sess.get_inputs()]
    missing = [name for name in wanted if name not in tensors]
    if missing:
        raise TrainmateError(
            f"the ONNX model's inputs {missing} are not in the example's {sorted(tensors)}"
        )
    return {name: _numpy(tensors[name]) for name in wanted}


def run(sess: onnxruntime.InferenceSession, example: Example) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, feeds(sess, example))
    except TrainmateError:
        raise
    except Exception as exc:
        batch = example.batch_size
        raise TrainmateError(
            f"onnxruntime fails on inputs of batch size {batch}: {first_line(exc)}"
        ) from None
    return dict(zip(names, values, strict=True))


def compare(
    inputs: str, name: str, reference: np.ndarray, actual: np.ndarray, rtol: float, atol: float
) -> ParityRow:
    """One output's differences; on failure, the element furthest beyond the tolerance."""
    import numpy as np

    if reference.shape != actual.shape:
        worst = f"shape {list(actual.shape)}, PyTorch's {list(reference.shape)}"
        return ParityRow(inputs, name, float("inf"), float("inf"), False, worst)
    if reference.size == 0:
        return ParityRow(inputs, name, 0.0, 0.0, True)
    ref = reference.astype(np.float64)
    got = actual.astype(np.float64)
    diff = np.abs(got - ref)
    both_nan = np.isnan(ref) & np.isnan(got)
    diff = np.where(both_nan, 0.0, diff)
    magnitude = np.abs(ref)
    relative = np.where(magnitude > atol, diff / np.where(magnitude > atol, magnitude, 1.0), 0.0)
    excess = np.nan_to_num(diff - (atol + rtol * magnitude), nan=np.inf)
    passed = bool((excess <= 0).all())
    max_abs = float(np.nan_to_num(diff, nan=np.inf).max())
    max_rel = float(np.nan_to_num(relative, nan=np.inf).max())
    worst = ""
    if not passed:
        index = np.unravel_index(int(np.argmax(excess)), excess.shape)
        where = ", ".join(str(int(i)) for i in index)
        worst = f"[{where}]: torch {ref[index]:.7g}, onnx {got[index]:.7g}"
    return ParityRow(inputs, name, max_abs, max_rel, passed, worst)


def input_sets(
    example: Example, batch_sizes: Sequence[int], dynamic_batch: bool, seed: int
) -> list[tuple[str, Example]]:
    """The example, then random inputs at each batch size (at the example's when it is fixed)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    own = example.batch_size
    sets = [(f"example (batch {own})", example)]
    sizes = list(batch_sizes) if dynamic_batch and own is not None else [own]
    for size in sizes:
        if size is not None:
            sets.append((f"random (batch {size})", example.with_batch(size, generator)))
    return sets


def check(
    model: nn.Module,
    example: Example,
    sess: onnxruntime.InferenceSession,
    *,
    batch_sizes: Sequence[int],
    dynamic_batch: bool,
    rtol: float,
    atol: float,
    seed: int = 0,
) -> tuple[ParityRow, ...]:
    """ONNX against PyTorch (eval mode) on every input set."""
    rows: list[ParityRow] = []
    for label, inputs in input_sets(example, batch_sizes, dynamic_batch, seed):
        try:
            reference = run_reference(model, inputs)
        except TrainmateError as exc:
            why = f"PyTorch fails too ({exc}): export with a fixed batch (dynamic_batch=False)"
            rows.append(ParityRow(label, "(all)", float("inf"), float("inf"), False, why))
            continue
        expected = [(name, _numpy(tensor)) for name, tensor in reference]
        try:
            actual = run(sess, inputs)
        except TrainmateError as exc:  # e.g. a batch size baked into the graph: a FAILED row
            rows.append(ParityRow(label, "(all)", float("inf"), float("inf"), False, str(exc)))
            continue
        rows += _rows(label, expected, actual, rtol, atol)
    return tuple(rows)


def check_sessions(
    reference: onnxruntime.InferenceSession,
    candidate: onnxruntime.InferenceSession,
    example: Example,
    *,
    batch_sizes: Sequence[int],
    dynamic_batch: bool,
    rtol: float,
    atol: float,
    seed: int = 0,
) -> tuple[ParityRow, ...]:
    """One ONNX model against another (int8 against float) on the same input sets."""
    rows: list[ParityRow] = []
    for label, inputs in input_sets(example, batch_sizes, dynamic_batch, seed):
        expected = list(run(reference, inputs).items())
        rows += _rows(label, expected, run(candidate, inputs), rtol, atol)
    return tuple(rows)


def _rows(
    label: str,
    reference: list[tuple[str, Any]],
    actual: dict[str, np.ndarray],
    rtol: float,
    atol: float,
) -> list[ParityRow]:
    if len(reference) != len(actual):
        names = ", ".join(actual)
        worst = f"the ONNX model has {len(actual)} outputs ({names}), PyTorch {len(reference)}"
        return [ParityRow(label, "(all)", float("inf"), float("inf"), False, worst)]
    rows = []
    for (name, expected), (onnx_name, value) in zip(reference, actual.items(), strict=True):
        shown = name if name == onnx_name else f"{name} ({onnx_name})"
        rows.append(compare(label, shown, expected, value, rtol, atol))
    return rows
