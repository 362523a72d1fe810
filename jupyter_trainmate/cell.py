"""
A `%%train` cell as IPython knows it: its name in tracebacks (`Cell In[5]`), and tracebacks that
start at the user's code.

IPython runs a cell magic from a line it writes itself,
`get_ipython().run_cell_magic('train', '', '<the whole cell>')`: left alone, a traceback shows
that line (the cell as one string) and then the magic's frames before the user's. And IPython
counts `execution_count` up before the cell runs, so the count at the time the magic runs names
the next cell.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from IPython.core.interactiveshell import InteractiveShell


def running_cell_number(ip: InteractiveShell) -> int:
    """The number IPython gave the cell now running (`In[N]`).

    The frame that runs `get_ipython().run_cell_magic(...)` is compiled under the running cell's
    name, and IPython's compiler maps that name to the number.
    """
    known: dict[str, int] = getattr(ip.compile, "_filename_map", {})
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        number = known.get(frame.f_code.co_filename)
        if number is not None:
            return number
        frame = frame.f_back
    return int(ip.execution_count)


# `transformed`'s answers: IPython's static transforms of a cell are a function of its text and
# of the transformer lists (the key holds them), so a re-run of the same cell (the common case in
# a notebook, and every trial of a benchmark) reuses the answer: tokenizing the cell again is
# about 12,000 Python opcodes of every run's start (issues 14 and 15).
_TRANSFORMED: dict[tuple[Any, ...], str] = {}
_TRANSFORMED_MOST = 64


def transformed(ip: InteractiveShell, cell: str) -> str:
    """`ip.transform_cell(cell)`, from a cache when IPython's answer is its static transform alone
    (`input_transformer_manager`'s): no `input_transformers_post`, and a result of more than one
    line (IPython passes a one-line result through the prefilter, which reads the namespace)."""
    if ip.input_transformers_post:
        return str(ip.transform_cell(cell))  # type: ignore[no-untyped-call]
    manager = ip.input_transformer_manager
    key = (
        cell,
        tuple(manager.cleanup_transforms),
        tuple(manager.line_transforms),
        tuple(manager.token_transformers),
    )
    try:
        source = _TRANSFORMED.get(key)
    except TypeError:  # a transform that cannot be hashed (a callable object with `__eq__`)
        return str(ip.transform_cell(cell))  # type: ignore[no-untyped-call]
    if source is not None:
        return source
    source = str(manager.transform_cell(cell))
    if len(source.splitlines()) == 1:
        return str(ip.transform_cell(cell))  # type: ignore[no-untyped-call]
    if len(_TRANSFORMED) >= _TRANSFORMED_MOST:
        _TRANSFORMED.pop(next(iter(_TRANSFORMED)))  # the oldest
    _TRANSFORMED[key] = source
    return source


def register_cell(ip: InteractiveShell, cell: str, source: str) -> str:
    """Register the cell's code with IPython under the running cell's number; its file name.

    The lines registered are `source` (the cell as IPython transformed it, what runs), as IPython
    does for its own cells, so traceback lines match the code.
    """
    return str(ip.compile.cache(source, running_cell_number(ip), raw_code=cell))


def traceback_from_cell(exc: BaseException, filename: str, ip: InteractiveShell) -> None:
    """Have IPython show `exc`'s traceback from the cell's own code on (`filename`'s frames).

    Uses IPython's `_render_traceback_` protocol, on this exception only; an exception that
    renders itself already, or never passed through the cell's code, is left as it is.
    """
    if hasattr(exc, "_render_traceback_"):
        return
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    if tb is None:
        return
    tb = _without_ours(tb)

    def render() -> list[str]:
        formatter: Any = ip.InteractiveTB
        return list(formatter.structured_traceback(type(exc), exc, tb, tb_offset=0))

    # An exception class with __slots__ takes no attribute: IPython's own traceback then.
    with contextlib.suppress(AttributeError):
        exc._render_traceback_ = render  # type: ignore[attr-defined]


_OURS = str(Path(__file__).resolve().parent)


def _without_ours(tb: TracebackType) -> TracebackType:
    """The traceback from the cell on without jupyter_trainmate's frames (the session's
    `backward`/`step` the rewrite calls): the user sees their code and the library's, as in a
    plain cell. A copy: the exception's own traceback (for `%debug`) keeps every frame."""
    kept = []
    node: TracebackType | None = tb
    while node is not None:
        if not node.tb_frame.f_code.co_filename.startswith(_OURS) or node is tb:
            kept.append(node)
        node = node.tb_next
    chain: TracebackType | None = None
    for node in reversed(kept):
        chain = TracebackType(chain, node.tb_frame, node.tb_lasti, node.tb_lineno)
    assert chain is not None
    return chain
