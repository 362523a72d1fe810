"""
Train PyTorch models in Jupyter: fast, observable and clean enough to ship.

## In a notebook

```python
%load_ext jupyter_trainmate
%trainmate doctor          # the pre-flight checks, as a table
%trainmate doctor --json   # the same as JSON
```

## On the command line

```console
$ trainmate doctor                 # Python, torch, CUDA, GPUs, TF32, pip check, /dev/shm, ...
$ trainmate doctor --json --data ./data   # ... plus file system, disk kind and read speed of ./data
```

`trainmate doctor` exits with status 0 when no check fails. A machine with no GPU, or no NVIDIA
driver, is a normal answer, not an error.

## In JupyterLab

The package ships a prebuilt JupyterLab 4 extension (a sidebar panel) and a Jupyter server
extension; installing the wheel enables both, with no Node.js needed.

Importing this package is cheap: torch, tornado and the doctor are imported only when used, so
`%load_ext jupyter_trainmate` does not slow a kernel's start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._version import __version__
from .runtime.summary import RunSummary, last_run

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell
    from jupyter_server.serverapp import ServerApp

__all__ = ["RunSummary", "__version__", "last_run", "load_ipython_extension"]


def load_ipython_extension(ip: InteractiveShell) -> None:
    """Register the trainmate magics (`%load_ext jupyter_trainmate`)."""
    from .magic import TrainmateMagics

    ip.register_magics(TrainmateMagics)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-trainmate"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_trainmate"}]


def _load_jupyter_server_extension(server_app: ServerApp) -> None:
    from .server import load_server_extension

    load_server_extension(server_app)
