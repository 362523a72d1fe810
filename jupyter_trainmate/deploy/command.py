"""`trainmate export|bench` and `%trainmate export|bench`: where the model and example come from.

In a notebook (`%trainmate`), MODEL and EXAMPLE are expressions in the notebook's namespace
(`%trainmate export model xb`). In a shell, MODEL is a checkpoint (a `%%train --checkpoint` file
or a plain state dict) and `--model PKG.module:builder` builds the module its weights load into
(a package written by `trainmate refactor`, installed or in the working directory);
`--example SHAPE[:DTYPE]` (`1,3,32,32`, `8,128:int64`; once per input) gives the inputs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TrainmateError

if TYPE_CHECKING:
    from torch import nn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `export` and `bench` share: where the model and the example come from."""
    parser.add_argument(
        "source",
        metavar="MODEL",
        help="in %%trainmate: the notebook's model (a name or expression); in a shell: a "
        "checkpoint file, with --model",
    )
    parser.add_argument(
        "example", metavar="EXAMPLE", nargs="?", help="in %%trainmate: the example input"
    )
    parser.add_argument(
        "--model",
        dest="builder",
        metavar="PKG.module:builder",
        help="the function (or class) that builds the module the checkpoint's weights load into",
    )
    parser.add_argument(
        "--example",
        dest="shapes",
        action="append",
        default=[],
        metavar="SHAPE[:DTYPE]",
        help="an input of this shape filled with random values, e.g. 1,3,32,32 or 8,128:int64 "
        "(once per input)",
    )
    parser.add_argument(
        "--format",
        choices=("table", "markdown", "json"),
        default="table",
        help="how to print the report (default: a table)",
    )


def resolve(args: argparse.Namespace) -> tuple[nn.Module, Any]:
    """The model and example the command line names."""
    import torch

    namespace = getattr(args, "user_ns", None)
    if args.builder:
        model = load_model(Path(args.source), args.builder)
    elif namespace is not None:
        model = _evaluate(args.source, namespace, "MODEL")
    else:
        raise TrainmateError(
            f"{args.source}: in a shell MODEL is a checkpoint: add --model PKG.module:builder"
        )
    if not isinstance(model, torch.nn.Module):
        raise TrainmateError(f"{args.source} is a {type(model).__name__}, not a torch.nn.Module")
    return model, resolve_example(args)


def onnx_file(args: argparse.Namespace) -> Path | None:
    """MODEL as an exported `.onnx` file (bench only), or None."""
    path = Path(args.source)
    if args.builder or path.suffix != ".onnx":
        return None
    if not path.is_file():
        raise TrainmateError(f"{path}: no such file")
    return path


def resolve_example(args: argparse.Namespace) -> Any:
    """The example: random tensors of the `--example` shapes, or the notebook's EXAMPLE."""
    namespace = getattr(args, "user_ns", None)
    if args.shapes:
        tensors = [example_tensor(spec) for spec in args.shapes]
        example: Any = tensors[0] if len(tensors) == 1 else tuple(tensors)
    elif args.example and namespace is not None:
        example = _evaluate(args.example, namespace, "EXAMPLE")
    else:
        raise TrainmateError("no example input: give --example SHAPE[:DTYPE]")
    return example


def show(report: Any, fmt: str, in_notebook: bool) -> None:
    """Print the report in the chosen format; in a notebook the table is shown as Markdown."""
    if fmt == "json":
        print(report.to_json())
    elif fmt == "markdown":
        print(report.to_markdown())
    elif in_notebook:
        from IPython.display import display

        display(report)  # type: ignore[no-untyped-call]
    else:
        print(report.to_text())


def example_tensor(spec: str) -> Any:
    """`1,3,32,32` or `1x3x32x32`, optionally `:int64` etc.: a random tensor of that shape."""
    import torch

    shape_text, _, dtype_name = spec.partition(":")
    try:
        shape = [int(n) for n in shape_text.replace("x", ",").split(",") if n.strip()]
    except ValueError:
        shape = []
    dtype = getattr(torch, dtype_name or "float32", None)
    if not shape or min(shape) < 1 or not isinstance(dtype, torch.dtype):
        raise TrainmateError(f"--example {spec}: give SHAPE[:DTYPE], e.g. 1,3,32,32 or 8,128:int64")
    generator = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    return torch.randint(0, 10, shape, generator=generator, dtype=dtype)


def load_model(checkpoint: Path, builder: str) -> nn.Module:
    """Build the module with `builder` and load the checkpoint's weights into it (strictly)."""
    import torch

    module_name, _, attr = builder.partition(":")
    if not module_name or not attr:
        raise TrainmateError(f"--model {builder}: give PKG.module:builder")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # a package written by trainmate refactor, here
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise TrainmateError(f"--model {builder}: {exc}") from None
    try:
        model = factory()
    except Exception as exc:
        raise TrainmateError(f"--model {builder}: calling it failed: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise TrainmateError(f"--model {builder} returned a {type(model).__name__}, not a Module")
    state = _model_state(checkpoint, model)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise TrainmateError(f"{checkpoint}: the weights do not fit {builder}: {first}") from None
    return model.eval()


def _model_state(checkpoint: Path, model: nn.Module) -> dict[str, Any]:
    """The state dict in a `%%train` checkpoint (the model whose keys fit) or a plain one."""
    import torch

    try:
        payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise TrainmateError(f"{checkpoint}: no such file") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainmateError(f"{checkpoint}: cannot load it ({first[:160]})") from None
    if not isinstance(payload, dict):
        raise TrainmateError(f"{checkpoint}: holds a {type(payload).__name__}, not weights")
    models = payload.get("models") if "format" in payload else None
    if not isinstance(models, dict):
        return payload  # a plain state dict
    wanted = set(model.state_dict())
    fitting = [name for name, state in models.items() if set(state) == wanted]
    if len(fitting) != 1:
        names = ", ".join(models) or "none"
        raise TrainmateError(
            f"{checkpoint}: {len(fitting)} of its models ({names}) fit the built module"
        )
    state: dict[str, Any] = models[fitting[0]]
    return state


def _evaluate(expression: str, namespace: dict[str, Any], what: str) -> Any:
    try:
        return eval(expression, namespace)  # the user's own kernel, as %timeit does
    except Exception as exc:
        raise TrainmateError(f"{what} {expression}: {type(exc).__name__}: {exc}") from None


def remember(kind: str, report: Any, args: argparse.Namespace) -> None:
    """Record the report with the run that made the model and, for an export of a refactored
    package's checkpoint, in the package's `MODEL_CARD.md` (see `attach.py`, `card.py`)."""
    from ..runtime.notebook import notebook_path
    from .attach import EXPORT, attach

    namespace = getattr(args, "user_ns", None)
    checkpoint = Path(args.source) if args.builder else None
    exported = onnx_file(args) if kind != EXPORT else None
    attached = attach(
        kind,
        report,
        notebook=notebook_path(namespace or {}),
        checkpoint=checkpoint,
        onnx_file=exported,
    )
    if attached is not None and args.format == "table":
        print(f"trainmate {kind}: {attached.describe()}", file=sys.stderr)
    if kind == EXPORT and args.builder:
        import json

        from .card import package_card, update_card

        card = package_card(args.builder)
        if card is None:
            return
        try:
            update_card(card, json.loads(report.to_json()), _today())
        except (OSError, UnicodeDecodeError, TrainmateError) as exc:
            print(f"trainmate export: {card} not updated: {exc}", file=sys.stderr)
            return
        if args.format == "table":
            print(f"trainmate export: updated the export section of {card}", file=sys.stderr)


def _today() -> str:
    import time

    return time.strftime("on %Y-%m-%d")
