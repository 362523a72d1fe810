"""
What the failing frames hold: the innermost frame of the user's own code (the cell, a notebook
function) and the innermost frame of the library call it made (a layer's `forward`, a loss in
`torch.nn.functional`), with the tensors, layers and loaders among their locals.

Values are read, never computed on a GPU: after a device-side assert every CUDA call fails, so
only CPU tensors have their values (minimum, maximum) read.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch

_PACKAGE = str(Path(__file__).resolve().parents[1])
_LIBRARY = tuple(
    p
    for p in {
        str(Path(torch.__file__).resolve().parent),
        _PACKAGE,
        sysconfig.get_paths().get("stdlib", ""),
        sysconfig.get_paths().get("purelib", ""),
        sysconfig.get_paths().get("platlib", ""),
    }
    if p
)


@dataclass(frozen=True)
class TensorFact:
    """A tensor seen in a frame, by the name it has there."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    requires_grad: bool = False
    grad_fn: str | None = None
    low: float | None = None  # the smallest value, CPU tensors only
    high: float | None = None
    finite: bool | None = None  # every value finite (CPU floating-point tensors only)

    def describe(self) -> str:
        shape = "(" + ", ".join(str(s) for s in self.shape) + ")"
        text = f"{self.name} {shape} {self.dtype} on {self.device}"
        if self.low is not None and self.high is not None and self.dtype.startswith("int"):
            text += f", values {self.low:g}..{self.high:g}"
        return text


@dataclass(frozen=True)
class Facts:
    """What the traceback's frames say about the failure."""

    user_line: str | None = None  # "<cell> line 7: loss = loss_fn(out, yb)"
    user_tensors: tuple[TensorFact, ...] = ()
    call: str | None = None  # the innermost library function: "Linear.forward", "cross_entropy"
    call_tensors: tuple[TensorFact, ...] = ()
    layer: str | None = None  # "Linear(in_features=8, out_features=16, bias=True)"
    layer_name: str | None = None  # its name in the notebook's model: "model.2"
    layer_input: TensorFact | None = None
    batch_size: int | None = None
    num_workers: int | None = None
    carried_graphs: tuple[TensorFact, ...] = ()  # user tensors that hold a graph
    extra: dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> tuple[TensorFact, ...]:
        return self.call_tensors + self.user_tensors


def is_library(filename: str) -> bool:
    """Code of torch, of the standard library, of installed packages or of jupyter_trainmate."""
    if filename.startswith("<"):  # <frozen ...>, <string>; IPython's cells are the user's
        return not filename.startswith(("<ipython-input", "<cell"))
    return str(Path(filename).resolve()).startswith(_LIBRARY)


def _frames(tb: TracebackType | None) -> Iterator[tuple[FrameType, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def tensor_fact(name: str, value: torch.Tensor) -> TensorFact:
    low = high = None
    finite = None
    if value.device.type == "cpu" and 0 < value.numel() <= 10_000_000 and not value.is_complex():
        try:
            detached = value.detach()
            low, high = float(detached.min()), float(detached.max())
            if detached.is_floating_point():
                finite = bool(torch.isfinite(detached).all())
        except RuntimeError:
            pass
    return TensorFact(
        name=name,
        shape=tuple(value.shape),
        dtype=str(value.dtype).removeprefix("torch."),
        device=str(value.device),
        requires_grad=value.requires_grad,
        grad_fn=type(value.grad_fn).__name__ if value.grad_fn is not None else None,
        low=low,
        high=high,
        finite=finite,
    )


def _tensors(local: Mapping[str, Any]) -> tuple[TensorFact, ...]:
    found = []
    for name, value in local.items():
        if name.startswith("__") or name == "self":
            continue
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            found.append(tensor_fact(name, value))
        elif isinstance(value, (list, tuple)) and 0 < len(value) <= 4:
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    found.append(tensor_fact(f"{name}[{i}]", item))
    return tuple(found[:12])


def _own_locals(frame: FrameType) -> dict[str, Any]:
    """A frame's variables; for a cell (module-level code, whose locals are the whole notebook
    namespace) only the names its code uses, in the order it uses them."""
    local = frame.f_locals
    if local is not frame.f_globals:
        return dict(local)
    names = dict.fromkeys((*frame.f_code.co_names, *frame.f_code.co_varnames))
    return {name: local[name] for name in names if name in local}


def _layer_name(layer: torch.nn.Module, namespace: Mapping[str, Any] | None) -> str | None:
    for name, value in (namespace or {}).items():
        if name.startswith("_") or not isinstance(value, torch.nn.Module):
            continue
        if value is layer:
            return name
        for sub, module in value.named_modules():
            if module is layer:
                return f"{name}.{sub}"
    return None


def _loader(namespace: Mapping[str, Any] | None, local: Mapping[str, Any]) -> Any:
    for scope in (local, namespace or {}):
        for name, value in scope.items():
            if not name.startswith("_") and isinstance(value, torch.utils.data.DataLoader):
                return value
    return None


def gather(
    exc: BaseException,
    namespace: Mapping[str, Any] | None = None,
    user_files: Container[str] = (),
) -> Facts:
    """The facts of `exc`'s traceback: `user_files` are the file names of the user's code (the
    cell's, as IPython registered it); any frame outside the libraries counts as the user's too."""
    frames = list(_frames(exc.__traceback__))
    user_index = None
    for i, (frame, _) in enumerate(frames):
        name = frame.f_code.co_filename
        if name in user_files or not is_library(name):
            user_index = i
    user_line = None
    user_tensors: tuple[TensorFact, ...] = ()
    local: Mapping[str, Any] = {}
    if user_index is not None:
        frame, lineno = frames[user_index]
        local = _own_locals(frame)
        user_tensors = _tensors(local)
        code = _source_line(frame, lineno)
        code = code if len(code) <= 80 else code[:77] + "..."
        user_line = f"line {lineno}: {code}" if code else f"line {lineno}"
    call = layer = layer_name = None
    layer_input = None
    call_tensors: tuple[TensorFact, ...] = ()
    after = frames[(user_index + 1) if user_index is not None else 0 :]
    for frame, _ in after:  # the innermost layer's forward under the user's line: "which layer"
        this = frame.f_locals.get("self")
        if isinstance(this, torch.nn.Module) and frame.f_code.co_name == "forward":
            layer, layer_name = this, _layer_name(this, namespace)
            for value in frame.f_locals.values():
                if isinstance(value, torch.Tensor):
                    layer_input = tensor_fact("input", value)
                    break
    for frame, _ in reversed(after):  # the innermost library function that holds tensors
        tensors = _tensors(frame.f_locals)
        if tensors:
            this = frame.f_locals.get("self")
            owner = f"{type(this).__name__}." if isinstance(this, torch.nn.Module) else ""
            call, call_tensors = owner + frame.f_code.co_name, tensors
            break
    loader = _loader(namespace, local)
    batch_size = getattr(loader, "batch_size", None) if loader is not None else None
    if batch_size is None:
        for fact in user_tensors:
            if fact.shape and fact.name in (
                "x",
                "xb",
                "inputs",
                "input",
                "images",
                "batch",
                "data",
            ):
                batch_size = fact.shape[0]
                break
    return Facts(
        user_line=user_line,
        user_tensors=user_tensors,
        call=call,
        call_tensors=call_tensors,
        layer=repr(layer) if layer is not None else None,
        layer_name=layer_name,
        layer_input=layer_input,
        batch_size=batch_size,
        num_workers=getattr(loader, "num_workers", None) if loader is not None else None,
        carried_graphs=tuple(f for f in user_tensors if f.grad_fn is not None),
    )


def _source_line(frame: FrameType, lineno: int) -> str:
    import linecache

    return linecache.getline(frame.f_code.co_filename, lineno, frame.f_globals).strip()
