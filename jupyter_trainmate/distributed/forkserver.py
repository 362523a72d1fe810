"""
Where the workers of `%%train --procs N --backend gloo` start from: multiprocessing's fork server
(the `forkserver` start method of torch's elastic launcher), kept for the kernel's life.

A spawned worker is a new interpreter that imports torch, DDP's `torch._dynamo` and the
`%%train` runtime (libcst among them) before it can run a line: seconds per worker, paid again
by every worker of every launch, and two workers on two cores pay them side by side. The fork
server is one fresh interpreter (started with `exec`, never a fork of the kernel, so a kernel that
used CUDA does not matter) that imports those modules once; each worker is a fork of it, ready at
once. The first launch of a kernel starts it (in the background, while the notebook builds the
payload); later launches find it running.

A worker is a copy of the server, so the server must be one the kernel would start now:

- **environment**: the variables at the server's start are the workers' (a library reading
  `OMP_NUM_THREADS` at import has read it there). When the kernel's environment differs from
  the one the server was started with, the server is stopped and started again;
- **Python path**: the server imports with the kernel's `sys.path` (passed as `PYTHONPATH` for
  its start; the workers put the kernel's own `PYTHONPATH` back, see `Job.environ`); a changed
  `sys.path` starts a new server too.

On GPUs (`--backend nccl`) the workers are still spawned: a forked worker must not find the CUDA
driver initialised in its parent, and that is not checked on a GPU machine here yet.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

# What the server imports: the parent's main module (the standard library's default), torch,
# the module DDP's constructor imports, and the worker with the `%%train` runtime it runs.
PRELOAD = (
    "__main__",
    "torch",
    "torch._dynamo",
    "jupyter_trainmate.distributed.worker",
    "jupyter_trainmate.runner",
)
# Set by the launcher in the kernel while it runs (not the user's environment).
_LAUNCHER_VARIABLES = ("TORCHELASTIC_",)


def start_method(backend: str) -> str:
    """`forkserver` for CPU workers where the platform has it, else `spawn`."""
    if backend == "gloo" and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return "spawn"


@dataclass(frozen=True)
class Started:
    """The server this module started: its process and what it was started with."""

    pid: int
    environ: tuple[tuple[str, str], ...]
    path: tuple[str, ...]


_started: Started | None = None


def _server() -> Any:
    """The standard library's one fork server of this process (what torch's launcher uses)."""
    return cast(Any, multiprocessing.forkserver)._forkserver


def _environment() -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((k, v) for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARIABLES))
    )


def _python_path() -> tuple[str, ...]:
    # "" (the working directory, which `%cd` changes) is the server's own first entry too
    return tuple(p for p in sys.path if isinstance(p, str) and p)


def ensure_running() -> Started:
    """Start the fork server with `PRELOAD`, or keep the running one if it is this module's and
    the kernel's environment and `sys.path` are still those it was started with."""
    global _started
    server = _server()
    environ, path = _environment(), _python_path()
    pid = server._forkserver_pid
    current = _started is not None and _started.pid == pid and pid is not None
    if pid is not None and not (current and _started == Started(pid, environ, path)):
        _let_go(server)  # another environment, or a server this module did not start
    preload = list(dict.fromkeys([*server._preload_modules, *PRELOAD]))
    server.set_forkserver_preload(preload)
    with _pythonpath(path):
        server.ensure_running()  # starts it, or (quickly) sees it alive
    _started = Started(server._forkserver_pid, environ, path)
    return _started


@contextlib.contextmanager
def _pythonpath(path: tuple[str, ...]) -> Iterator[None]:
    """PYTHONPATH set to the kernel's `sys.path` while the server process is started."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def worker_environ() -> dict[str, str | None]:
    """What a worker forked from the server puts back into its environment: the kernel's own
    PYTHONPATH (None: unset)."""
    return {"PYTHONPATH": os.environ.get("PYTHONPATH")}


def restore(environ: Mapping[str, str | None]) -> None:
    """In a worker: the kernel's values of `environ`'s variables (None: unset)."""
    for key, value in environ.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _let_go(server: Any) -> None:
    """Close the server's "alive" pipe and forget it, without waiting: it leaves once no process
    holds the pipe, and its children (workers of an earlier launch still ending, their loader
    workers) hold it too. The standard library's `_stop()` waits for that, which could be for
    ever. A thread reaps it."""
    with server._lock:
        pid, alive = server._forkserver_pid, server._forkserver_alive_fd
        if pid is None:
            return
        with contextlib.suppress(OSError):
            os.close(alive)
        address = server._forkserver_address
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
    if isinstance(address, str) and address and not address.startswith("\0"):
        with contextlib.suppress(OSError):
            Path(address).unlink()
    threading.Thread(
        target=_reap, args=(pid,), name="trainmate-forkserver-reap", daemon=True
    ).start()


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)


def stop() -> None:
    """Let the server go (the next launch starts a new one)."""
    global _started
    _let_go(_server())
    _started = None
