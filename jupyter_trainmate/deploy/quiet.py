"""Quiet the exporters and the quantiser: progress prints and log lines off, warnings kept.

`torch.onnx` prints its progress and logs a line per missing optional operator library;
onnxruntime's quantiser logs through the root logger (whose first use would also install a
handler on it for good). The user warnings they raise are collected for the report.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator

from .inputs import first_line

QUIET_LOGGERS = ("", "torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch.fx")


@contextlib.contextmanager
def quiet(caught: list[str]) -> Iterator[None]:
    """Run the block quietly; append its warnings (deduplicated, one line each) to `caught`."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    root_guard = logging.NullHandler()  # logging.warning() calls basicConfig() on a bare root
    logging.getLogger().addHandler(root_guard)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    sink = io.StringIO()
    try:
        with (
            warnings.catch_warnings(record=True) as records,
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("always")
            yield
    finally:
        logging.getLogger().removeHandler(root_guard)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
    for record in records:
        if issubclass(record.category, DeprecationWarning | FutureWarning):
            continue  # about the libraries' own internals, not the user's model
        line = f"{record.category.__name__}: {first_line(Exception(str(record.message)))}"
        if line not in caught:
            caught.append(line)
