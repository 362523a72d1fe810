"""The optional packages of `jupyter_trainmate[export]`: a missing one is a one-line error."""

from __future__ import annotations

import importlib.util

from ..errors import TrainmateError

INSTALL = "pip install 'jupyter_trainmate[export]'"


def require(*modules: str) -> None:
    """Raise a `TrainmateError` naming the missing modules and the exact `pip install` to run."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        names = " ".join(missing)
        raise TrainmateError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
            f"run `{INSTALL}` (or `pip install {names}`)"
        )
