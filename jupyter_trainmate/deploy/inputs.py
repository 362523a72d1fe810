"""The example a model is exported and measured with: its call, names, batch axis and variants.

`example` is what the model is called with: a tensor (`model(x)`), a tuple or list (positional
arguments, `model(*example)`), or a dict (keyword arguments when its keys are parameters of
`forward`, else one dict argument). Tensors are named from `forward`'s signature: parameter `x`
gives `x`, a dict parameter `batch` with key `image` gives `batch_image`, a tuple `pair` gives
`pair_0`, `pair_1`. Outputs are named `output`, `output_0`..., or by their dict keys.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import TrainmateError

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class Example:
    """A model call: positional and keyword arguments bound to `forward`'s parameters."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    params: tuple[str, ...]  # the parameter name of each positional argument, then each keyword

    @property
    def structure(self) -> dict[str, Any]:
        """The arguments by parameter name, in call order (what names and dynamic shapes follow)."""
        return dict(zip(self.params, (*self.args, *self.kwargs.values()), strict=True))

    def leaves(self) -> list[tuple[str, torch.Tensor]]:
        """The input tensors with their names, in the exporter's flattening order."""
        return _named_leaves(self.structure, "")

    @property
    def batch_size(self) -> int | None:
        """Dimension 0 of the first tensor with at least one dimension."""
        sizes = [t.shape[0] for _, t in self.leaves() if t.dim() >= 1]
        return int(sizes[0]) if sizes else None

    def call(self, model: nn.Module) -> Any:
        return model(*self.args, **self.kwargs)

    def map(self, fn: Any) -> Example:
        """A new example with `fn(tensor)` for each tensor that carries the batch axis."""
        from torch.utils import _pytree as pytree

        batch = self.batch_size

        def one(value: Any) -> Any:
            import torch

            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == batch:
                return fn(value)
            return value

        args, kwargs = pytree.tree_map(one, (self.args, self.kwargs))
        return Example(tuple(args), dict(kwargs), self.params)

    def with_batch(self, size: int, generator: torch.Generator | None = None) -> Example:
        """Random inputs like the example's (dtype, value range) with batch size `size`."""
        return self.map(lambda t: random_like(t, size, generator))

    def repeated(self, size: int) -> Example:
        """The example's own rows repeated up to batch size `size` (the exporter's retry)."""
        import torch

        def grow(t: torch.Tensor) -> torch.Tensor:
            reps = -(-size // t.shape[0])
            return torch.cat([t] * reps)[:size]

        return self.map(grow)


def make_example(model: nn.Module, example: Any) -> Example:
    """Bind `example` to `model.forward`'s signature (see the module docstring); an `Example`
    already bound is returned as it is."""
    import torch

    if isinstance(example, Example):
        return example

    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C-implemented forward
        signature = None
    names = list(signature.parameters) if signature else []
    if isinstance(example, torch.Tensor):
        args: tuple[Any, ...] = (example,)
        kwargs: dict[str, Any] = {}
    elif isinstance(example, list | tuple):
        args, kwargs = tuple(example), {}
    elif isinstance(example, dict) and example and set(example) <= set(names):
        args, kwargs = (), dict(example)
    elif isinstance(example, dict):
        args, kwargs = (example,), {}
    else:
        raise TrainmateError(
            f"the example is a {type(example).__name__}: give a tensor, a tuple of inputs or a dict"
        )
    if signature is not None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TrainmateError(
                f"the example does not fit {type(model).__name__}.forward: {exc}"
            ) from None
        args, kwargs = bound.args, bound.kwargs
        positional = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        params = [positional[i] if i < len(positional) else f"input_{i}" for i in range(len(args))]
    else:
        params = [f"input_{i}" for i in range(len(args))]
    params += list(kwargs)
    leaves = _named_leaves(dict(zip(params, (*args, *kwargs.values()), strict=True)), "")
    if not leaves:
        raise TrainmateError("the example holds no tensor")
    return Example(tuple(args), dict(kwargs), tuple(params))


def output_leaves(output: Any) -> list[tuple[str, torch.Tensor]]:
    """The output tensors with their names (`output`, `output_0`, ..., dict keys)."""
    import torch

    if isinstance(output, torch.Tensor):
        return [("output", output)]
    if isinstance(output, dict):
        return _named_leaves(output, "")
    return _named_leaves({"output": output}, "")


def _named_leaves(value: Any, name: str) -> list[tuple[str, torch.Tensor]]:
    import torch

    if isinstance(value, torch.Tensor):
        return [(name or "input", value)]
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return []  # a number, None or a string: a constant of the graph
    found: list[tuple[str, torch.Tensor]] = []
    for key, item in items:
        found += _named_leaves(item, f"{name}_{key}" if name else key)
    return found


def random_like(t: torch.Tensor, size: int, generator: torch.Generator | None) -> torch.Tensor:
    """A random tensor of `t`'s dtype and trailing shape, values in `t`'s range for integers."""
    import torch

    shape = (size, *t.shape[1:])
    if t.dtype == torch.bool:
        made = torch.randint(0, 2, shape, generator=generator).bool()
    elif t.dtype.is_floating_point:
        made = torch.randn(shape, generator=generator).to(t.dtype)
    else:
        low, high = (int(t.min()), int(t.max())) if t.numel() else (0, 1)
        made = torch.randint(low, high + 1, shape, generator=generator, dtype=t.dtype)
    return made.to(t.device)  # drawn on the CPU: the same values whatever the device


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (dropout off, BatchNorm's running statistics) and put back each module's mode."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def run_reference(model: nn.Module, example: Example) -> list[tuple[str, torch.Tensor]]:
    """The model's named outputs on `example` in eval mode (a one-line error if it fails)."""
    import torch

    try:
        with eval_mode(model), torch.inference_mode():
            outputs = output_leaves(example.call(model))
    except Exception as exc:
        raise TrainmateError(
            f"the model does not run on the example: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    if not outputs:
        raise TrainmateError("the model returns no tensor on the example")
    return outputs


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, without terminal colour codes."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    return next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
