"""What the rewrite found and did: shared by every transformer, reported by `--show`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

SESSION = "__trainmate__"
"""The name under which the running `TrainSession` is visible to rewritten code."""


def one_line(code: str) -> str:
    """Source that spans lines (`tqdm(enumerate(\\n    batches(...)),\\n    total=n)`) on one
    line: a note is one line of `--show` and of the run summary's lists."""
    if "\n" not in code:
        return code
    return re.sub(r"\(\s+", "(", re.sub(r"\s*\n\s*", " ", code)).replace(" )", ")")


@dataclass(frozen=True)
class Note:
    """One thing the rewrite instrumented, or left alone and why."""

    kind: Literal["instrumented", "left alone"]
    where: str  # "cell line 7" or "function train_epoch line 3"
    what: str
    reason: str = ""
    line: int = 0  # for ordering: the line in the cell

    def __str__(self) -> str:
        text = f"{self.kind:12s} {self.where}: {self.what}"
        return f"{text} ({self.reason})" if self.reason else text


@dataclass
class RewriteContext:
    """Carried through one rewrite: where we are and the notes so far."""

    origin: str = "cell"  # "cell" or "function NAME"
    line_offset: int = 0  # a function's first line in its cell, so notes name the cell's lines
    notes: list[Note] = field(default_factory=list)
    batch_sources: list[str] = field(default_factory=list)  # the loaders the batch loops iterate

    def where(self, line: int) -> str:
        return f"{self.origin} line {line + self.line_offset}"

    def instrumented(self, line: int, what: str, reason: str = "") -> None:
        self.notes.append(
            Note("instrumented", self.where(line), one_line(what), reason, line + self.line_offset)
        )

    def left_alone(self, line: int, what: str, reason: str) -> None:
        self.notes.append(
            Note("left alone", self.where(line), one_line(what), reason, line + self.line_offset)
        )

    def sorted_notes(self) -> list[Note]:
        return sorted(self.notes, key=lambda note: note.line)
