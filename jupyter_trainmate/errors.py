"""Errors meant for the user: one line naming what was wrong, shown without a traceback."""

from __future__ import annotations


class TrainmateError(Exception):
    """Bad input from the user. The CLI prints it as one line and exits 2; magics raise UsageError."""


class NanDetected(TrainmateError):
    """`--on-nan stop` found a non-finite loss; the run fails with this one-line reason."""
