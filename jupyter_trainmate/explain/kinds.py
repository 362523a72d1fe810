"""What an explanation is: its kind (the public names) and the frozen record every front end shows."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

ErrorKind = Literal[
    "out_of_memory",
    "device_mismatch",
    "dtype_mismatch",
    "shape_mismatch",
    "index_out_of_range",
    "nan_loss",
    "dataloader_worker",
    "too_many_open_files",
    "cudnn_cublas",
    "inplace_autograd",
    "backward_twice",
    "unknown",
]
"""The kinds of failure `%%train` explains. These names are a public interface: they stay."""

KINDS: tuple[ErrorKind, ...] = typing.get_args(ErrorKind)


@dataclass(frozen=True)
class Explanation:
    """Why a run failed, in the user's words.

    `message` says what happened in one line, `cause` the likely cause with the real values (the
    shapes, dtypes and devices of the tensors involved, the batch size, the memory), `advice`
    the fixes, most likely first, naming the `%%train` option that applies. `restartable`:
    a restart from the last checkpoint may cure it (`--retries`).
    """

    kind: ErrorKind
    message: str
    cause: str = ""
    advice: tuple[str, ...] = field(default=())
    restartable: bool = False

    def text(self) -> str:
        """The explanation as a few lines of plain text (the text view, `trainmate explain`)."""
        lines = [f"trainmate: {self.kind.replace('_', ' ')}: {self.message}"]
        if self.cause:
            lines.append(f"  cause: {self.cause}")
        lines += [f"  {i}. {item}" for i, item in enumerate(self.advice, 1)]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "cause": self.cause,
            "advice": list(self.advice),
            "restartable": self.restartable,
        }
