"""
The exception of a traceback given as text (`trainmate explain FILE`): the last `Type: message`
line that follows a traceback, with the lines of its message that come after it. Works on
Python's own tracebacks, IPython's (with or without colours) and a bare `Type: message`.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# `torch.OutOfMemoryError: CUDA out of memory...`, `RuntimeError: ...`, `OSError: [Errno 24] ...`
_HEAD = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Detected|Exit|Warning)):\s?(.*)$"
)
_FRAME = re.compile(r"^\s*(File \"|Cell In\[|\S+\.py:\d+|-+>|\d+ |Traceback \(most recent)")


def last_exception(text: str) -> tuple[str, str] | None:
    """`(type name, message)` of the last exception in `text`, or None when none is found."""
    lines = _ANSI.sub("", text).splitlines()
    found = None
    for i, line in enumerate(lines):
        head = _HEAD.match(line.strip())
        if head is None:
            continue
        body = [head.group(2)]
        for follow in lines[i + 1 :]:
            if not follow.strip() or _FRAME.match(follow) or _HEAD.match(follow.strip()):
                break
            body.append(follow.strip())
        found = (head.group(1), "\n".join(body).strip())
    return found
