"""int8: onnxruntime's dynamic quantisation of MatMul and Gemm weights.

Convolutions stay in float (onnxruntime's dynamic int8 convolutions are slow or unsupported).
Weights take 7 bits (`reduce_range`): onnxruntime multiplies uint8 activations by int8 weights,
and on x86 CPUs without VNNI (AVX2, AVX-512 before Cascade Lake) its kernel adds products in
pairs into 16 bits, which saturates with full-range weights. Measured on an AVX2 AMD EPYC with
the test MLP (64-256-10): full range, 24% of the largest output off the float model; 7 bits, 1.6%.
The file is made once and may run on any CPU, so the range is reduced whatever CPU exports it.
The int8 model is compared with the float ONNX model on the same inputs as the export's parity
check, at a looser stated tolerance (int8 is not meant to match to 1e-4); with
`validate=(loader, metric)` both models are scored on the loader, and that delta decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainmateError
from .inputs import Example, first_line
from .report import Quantization

if TYPE_CHECKING:
    import onnxruntime

INT8_RTOL = 0.05
INT8_ATOL = 0.05


def int8_path(path: Path) -> Path:
    """`model.onnx` -> `model.int8.onnx`."""
    return path.with_suffix(".int8.onnx")


def quantize_int8(
    float_model: Path,
    float_session: onnxruntime.InferenceSession,
    example: Example,
    final_path: Path,
    batch_sizes: Sequence[int],
    dynamic_batch: bool,
    validate: tuple[Any, Callable[..., float]] | None,
    seed: int,
) -> Quantization:
    """Write the int8 model beside `float_model` (the staging folder) and compare it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from . import parity

    out = int8_path(float_model)
    source = float_model.with_name("quantize-input.onnx")
    try:
        _without_weight_shapes(float_model, source)
        quantize_dynamic(
            str(source),
            str(out),
            op_types_to_quantize=["MatMul", "Gemm"],
            weight_type=QuantType.QInt8,
            reduce_range=True,  # no saturation on x86 without VNNI (see the module docstring)
        )
    except Exception as exc:
        raise TrainmateError(f"int8 quantisation failed: {first_line(exc)}") from None
    finally:
        source.unlink(missing_ok=True)  # everything in the staging folder is published
    int8_session = parity.session(out)
    rows = parity.check_sessions(
        float_session,
        int8_session,
        example,
        batch_sizes=batch_sizes,
        dynamic_batch=dynamic_batch,
        rtol=INT8_RTOL,
        atol=INT8_ATOL,
        seed=seed,
    )
    metric_float = metric_int8 = None
    if validate is not None:
        loader, metric = validate
        metric_float = score(float_session, example, loader, metric)
        metric_int8 = score(int8_session, example, loader, metric)
    return Quantization(
        path=str(int8_path(final_path)),
        size_before=float_model.stat().st_size,
        size_after=out.stat().st_size,
        parity=rows,
        rtol=INT8_RTOL,
        atol=INT8_ATOL,
        metric_float=metric_float,
        metric_int8=metric_int8,
    )


def score(
    sess: onnxruntime.InferenceSession,
    example: Example,
    loader: Any,
    metric: Callable[..., float],
) -> float:
    """The mean of `metric(output, target)` over the loader's `(inputs, target)` batches.

    `inputs` is given the way the export's example was (tensor, tuple or dict); `output` is the
    first output as a tensor.
    """
    import torch

    from . import parity

    names = example.params
    total = 0.0
    count = 0
    for batch in loader:
        inputs, target = batch[0], batch[1]
        call = _as_example(inputs, names)
        output = next(iter(parity.run(sess, call).values()))
        total += float(metric(torch.from_numpy(output), target))
        count += 1
    if not count:
        raise TrainmateError("validate: the loader gave no batch")
    return total / count


def _as_example(inputs: Any, params: tuple[str, ...]) -> Example:
    import torch

    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)

    if isinstance(inputs, dict) and set(inputs) <= set(params):
        return Example((), dict(inputs), tuple(inputs))
    args = tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)
    return Example(args, {}, params[: len(args)])


def _without_weight_shapes(float_model: Path, copy: Path) -> None:
    """A copy of the model, beside it, without the shapes the exporter records for its weights.

    The quantiser transposes Gemm weights and keeps those shapes, and onnxruntime before 1.32
    then refuses its own output ("Inferred shape and existing shape differ"); the shapes are
    redundant (a weight's shape is its initializer's). External data stays where it is: the copy
    lies in the same folder and refers to it by the same relative names.
    """
    import onnx

    model = onnx.load(str(float_model), load_external_data=False)
    weights = {init.name for init in model.graph.initializer}
    kept = [info for info in model.graph.value_info if info.name not in weights]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    onnx.save(model, str(copy))
