"""`jupyter_trainmate.export()`: ONNX export, checked in onnxruntime, written atomically.

The exporters are tried in order: `torch.onnx.export(dynamo=True)` (the default since torch 2.9)
on the example; the same on the example's rows repeated to batch 2 (an exporter may specialise a
size-1 dimension); then the TorchScript exporter (`dynamo=False`). The report says which worked
and each failed one's first error line (the innermost cause). Everything is written into a
temporary folder beside `path` and moved into place only when the export, the ONNX checker and
onnxruntime's parity run are done: nothing half-written lands at `path`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainmateError
from .deps import require
from .inputs import Example, eval_mode, first_line, make_example, run_reference
from .quiet import quiet
from .report import Attempt, ExportReport, TensorSpec, report_path

if TYPE_CHECKING:
    from torch import nn

# Over this many bytes of weights the model goes to an external data file (protobuf's 2 GB limit).
SINGLE_FILE_LIMIT = 1_800_000_000


class ExportError(TrainmateError):
    """No exporter could export the model; `attempts` holds each one's first error line."""

    def __init__(self, message: str, attempts: tuple[Attempt, ...], operator: str | None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.operator = operator


def export(
    model: nn.Module,
    example: Any,
    path: str | os.PathLike[str] = "model.onnx",
    *,
    dynamic_batch: bool = True,
    quantize: str | None = None,
    validate: tuple[Any, Callable[..., float]] | None = None,
    opset: int | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    batch_sizes: Sequence[int] = (1, 3, 8),
    seed: int = 0,
) -> ExportReport:
    """Export `model` to ONNX at `path`, check it in onnxruntime and return an `ExportReport`
    (`example`: a tensor, a tuple, a dict, or an `Example` already bound to the signature)."""
    require("onnx", "onnxscript", "onnxruntime")
    if quantize not in (None, "int8"):
        raise TrainmateError(f"--quantize {quantize}: the choice is int8")
    from . import parity
    from .quantize import quantize_int8

    path = Path(path)
    if path.suffix != ".onnx":
        raise TrainmateError(f"{path}: the output file name ends in .onnx")
    if not path.parent.is_dir():
        raise TrainmateError(f"{path.parent}: no such folder")
    inputs = make_example(model, example)
    reference = run_reference(model, inputs)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        target = staging / path.name
        caught: list[str] = []
        with eval_mode(model), quiet(caught):
            attempts = _export_first_that_works(
                model, inputs, target, [n for n, _ in reference], dynamic_batch, opset
            )
        specs, used_opset = _check(target)
        if dynamic_batch:
            caught += _fixed_batch(inputs, specs[0])
        sess = parity.session(target)
        rows = parity.check(
            model,
            inputs,
            sess,
            batch_sizes=batch_sizes,
            dynamic_batch=dynamic_batch,
            rtol=rtol,
            atol=atol,
            seed=seed,
        )
        quantization = None
        if quantize == "int8":
            with quiet(caught):
                quantization = quantize_int8(
                    target, sess, inputs, path, batch_sizes, dynamic_batch, validate, seed
                )
        report = ExportReport(
            path=str(path),
            exporter=next(a.exporter for a in attempts if a.ok),
            attempts=attempts,
            opset=used_opset,
            inputs=specs[0],
            outputs=specs[1],
            parity=rows,
            rtol=rtol,
            atol=atol,
            provider="CPUExecutionProvider",
            size=sum(f.stat().st_size for f in staging.iterdir() if f.name.startswith(path.name)),
            quantization=quantization,
            warnings=tuple(caught),
        )
        report_path(target).write_text(report.to_json() + "\n")
        _publish(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _export_first_that_works(
    model: nn.Module,
    inputs: Example,
    target: Path,
    outputs: list[str],
    dynamic_batch: bool,
    opset: int | None,
) -> tuple[Attempt, ...]:
    names = [n for n, _ in inputs.leaves()]
    external = sum(p.numel() * p.element_size() for p in model.parameters()) > SINGLE_FILE_LIMIT
    tries: list[tuple[str, Callable[[], None]]] = [
        (
            "dynamo",
            lambda: _dynamo(model, inputs, target, names, outputs, dynamic_batch, opset, external),
        ),
    ]
    if dynamic_batch and (inputs.batch_size or 0) < 2:
        doubled = inputs.repeated(2)
        tries.append(
            (
                "dynamo (batch 2 example)",
                lambda: _dynamo(model, doubled, target, names, outputs, True, opset, external),
            )
        )
    tries.append(
        (
            "torchscript",
            lambda: _torchscript(
                model, inputs, target, names, outputs, dynamic_batch, opset, external
            ),
        )
    )
    attempts: list[Attempt] = []
    for name, run in tries:
        try:
            run()
        except Exception as exc:
            attempts.append(Attempt(name, False, _innermost_line(exc)))
            for leftover in target.parent.iterdir():
                leftover.unlink()
            continue
        attempts.append(Attempt(name, True))
        return tuple(attempts)
    operator = next(filter(None, (_operator(a.error) for a in attempts)), None)
    cause = f"the exporter rejects operator {operator}" if operator else "no exporter succeeded"
    tried = "; ".join(f"{a.exporter}: {a.error}" for a in attempts)
    raise ExportError(f"cannot export to ONNX: {cause} ({tried})", tuple(attempts), operator)


def _batched(inputs: Example) -> Callable[[Any], bool]:
    import torch

    batch = inputs.batch_size
    return lambda t: isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == batch


def _dynamo(
    model: nn.Module,
    inputs: Example,
    target: Path,
    names: list[str],
    outputs: list[str],
    dynamic_batch: bool,
    opset: int | None,
    external: bool,
) -> None:
    import torch
    from torch.utils import _pytree as pytree

    shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch")
        is_batched = _batched(inputs)
        shapes = {
            param: pytree.tree_map(lambda t: {0: batch} if is_batched(t) else None, value)
            for param, value in inputs.structure.items()
        }
    args, kwargs = inputs.args, inputs.kwargs
    if args and isinstance(args[-1], dict):  # torch.onnx would read it as keyword arguments
        kwargs = {inputs.params[len(args) - 1]: args[-1], **kwargs}
        args = args[:-1]
    program = torch.onnx.export(
        model,
        args,
        kwargs=kwargs or None,
        dynamo=True,
        dynamic_shapes=shapes,
        input_names=names,
        output_names=outputs,
        opset_version=opset,
        verbose=False,
    )
    assert program is not None
    program.save(str(target), external_data=external)


def _torchscript(
    model: nn.Module,
    inputs: Example,
    target: Path,
    names: list[str],
    outputs: list[str],
    dynamic_batch: bool,
    opset: int | None,
    external: bool,
) -> None:
    import torch

    args = inputs.args
    if args and isinstance(args[-1], dict):
        args = (*args, {})  # a trailing dict would be read as keyword arguments
    axes = None
    if dynamic_batch:
        is_batched = _batched(inputs)
        reference = run_reference(model, inputs)
        batched = [n for n, t in inputs.leaves() if is_batched(t)]
        batched += [n for n, t in reference if is_batched(t)]
        axes = {name: {0: "batch"} for name in batched}
    torch.onnx.export(
        model,
        args,
        str(target),
        kwargs=inputs.kwargs or None,
        dynamo=False,
        input_names=names,
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=opset,
        external_data=external,
        verbose=False,
    )


def _fixed_batch(inputs: Example, specs: tuple[TensorSpec, ...]) -> list[str]:
    """A warning per batched input whose first axis the exported graph fixed to a number."""
    is_batched = _batched(inputs)
    batched = {name for name, tensor in inputs.leaves() if is_batched(tensor)}
    return [
        f"the batch axis of input {spec.name} is fixed at {spec.shape[0]} in the ONNX graph: "
        "the model specialises it (a Python int taken from a shape, a reshape to a constant)"
        for spec in specs
        if spec.name in batched and spec.shape and not isinstance(spec.shape[0], str)
    ]


def _check(target: Path) -> tuple[tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]], int]:
    """The ONNX checker, then the graph's inputs and outputs and the default domain's opset."""
    import onnx

    try:
        onnx.checker.check_model(str(target))
    except Exception as exc:
        raise TrainmateError(
            f"the exported model fails the ONNX checker: {first_line(exc)}"
        ) from None
    proto = onnx.load(str(target), load_external_data=False)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)

    def spec(value: Any) -> TensorSpec:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_param or d.dim_value for d in tensor.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        return TensorSpec(value.name, dims, dtype)

    graph = proto.graph
    return (tuple(spec(v) for v in graph.input), tuple(spec(v) for v in graph.output)), opset


def _publish(staging: Path, path: Path) -> None:
    """Move the files into place: weights first, the model, then its report (last means done)."""
    order = {path.name: 1, report_path(path).name: 3}
    for file in sorted(
        staging.iterdir(), key=lambda f: (order.get(f.name, 0 if ".data" in f.name else 2), f.name)
    ):
        file.replace(path.parent / file.name)


def _innermost_line(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {first_line(exc)}"


OPERATOR = re.compile(r"op='([^']+)'|operator '([^']+)'|namespace ([\w:.]+?)\.?(?:\s|$)")


def _operator(error: str) -> str | None:
    match = OPERATOR.search(error)
    return next(filter(None, match.groups()), None) if match else None
