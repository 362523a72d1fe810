"""Where the notebook of a run is, as the Jupyter server told the kernel, and the folder beside it
that holds its run records, TensorBoard logs and default checkpoints."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path


def notebook_path(namespace: Mapping[str, object]) -> str | None:
    """The notebook a kernel runs, as the Jupyter server told it (None in a plain IPython)."""
    path = os.environ.get("JPY_SESSION_NAME") or namespace.get("__session__")
    return str(path) if path else None


def runs_folder(notebook: str | None) -> Path:
    """`runs/` beside the notebook (or in the working directory)."""
    return _runs_in(os.path.dirname(notebook) if notebook else os.getcwd())


@functools.lru_cache(maxsize=16)
def _runs_in(folder: str) -> Path:
    """`folder/runs` (a `Path` is built once: a run asks for it twice, and a sweep per trial)."""
    return Path(folder) / "runs"
