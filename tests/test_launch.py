"""How `%%train --procs` starts its workers (distributed/forkserver.py, distributed/launch.py):
the fork server kept between launches and started again when the kernel's environment or Python
path changed, the static rendezvous, the root cause of a failure.

One test launches (two launches, two ranks each); the others start no worker.
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate.distributed import forkserver

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
"""
CELL = """%%train --procs 2 --backend gloo --display off
import os
for xb, yb in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
server = os.getppid()
probe = os.environ.get("TRAINMATE_TEST_PROBE")
pythonpath = os.environ.get("PYTHONPATH")
"""


def _server() -> Any:
    return cast(Any, multiprocessing.forkserver)._forkserver


def _gone(pid: int) -> bool:
    """The process has left and was reaped (within a few seconds: the server is let go without
    waiting, and a thread reaps it)."""
    for _ in range(400):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        threading.Event().wait(0.025)
    return False


def _environ_of(pid: int) -> dict[str, str]:
    """The environment the server process was started with (once it has run `exec`)."""
    for _ in range(400):
        if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
            break
        threading.Event().wait(0.025)
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (entry.decode().split("=", 1) for entry in raw if b"=" in entry)
    return dict(pairs)


def test_workers_are_forked_from_one_server_that_sees_the_kernels_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two launches: the workers of both are children of the same fork server (this module's),
    which was started again for the variable set just before the first, and the workers' own
    PYTHONPATH is the kernel's, not the one the server was started with."""
    monkeypatch.setenv("TRAINMATE_TEST_PROBE", f"set before the launch {os.getpid()}")
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    weight = ip.user_ns["model"].weight.detach().clone()
    ip.run_cell(CELL).raise_error()
    first = ip.user_ns["server"]
    assert forkserver._started is not None
    assert first == forkserver._started.pid != os.getpid()
    assert ip.user_ns["probe"] == f"set before the launch {os.getpid()}"
    assert ip.user_ns["pythonpath"] == os.environ.get("PYTHONPATH")
    assert not ip.user_ns["model"].weight.detach().equal(weight)  # it trained, and came back
    ip.run_cell(CELL).raise_error()
    assert ip.user_ns["server"] == first


def test_the_server_is_kept_until_the_environment_or_the_path_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No worker: the server itself (with nothing preloaded, so it starts at once)."""
    server = _server()
    monkeypatch.setattr(forkserver, "PRELOAD", ("__main__",))
    monkeypatch.setattr(server, "_preload_modules", ["__main__"])
    forkserver.stop()
    try:
        first = forkserver.ensure_running().pid
        assert forkserver.ensure_running().pid == first  # kept
        monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM")  # the launcher's own
        assert forkserver.ensure_running().pid == first
        # started with the kernel's sys.path as PYTHONPATH; the kernel's own is left alone
        assert _environ_of(first)["PYTHONPATH"].split(os.pathsep) == [p for p in sys.path if p]
        assert os.environ.get("PYTHONPATH") == forkserver.worker_environ()["PYTHONPATH"]

        monkeypatch.setenv("TRAINMATE_TEST_PROBE", "changed")
        second = forkserver.ensure_running().pid
        assert second != first
        assert _gone(first)  # stopped, not left behind
        assert _environ_of(second)["TRAINMATE_TEST_PROBE"] == "changed"

        monkeypatch.syspath_prepend(str(tmp_path))
        third = forkserver.ensure_running().pid
        assert third != second
        assert _environ_of(third)["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)

        forkserver.stop()  # a server this module did not start is replaced
        multiprocessing.forkserver.ensure_running()
        foreign = server._forkserver_pid
        assert forkserver.ensure_running().pid != foreign
    finally:
        forkserver.stop()


def test_letting_the_server_go_does_not_wait_for_its_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server leaves once none of its children holds its pipe: a worker of an earlier launch
    still ending must not hold up the next launch (the standard library's `_stop()` waits)."""
    import multiprocessing
    import time

    monkeypatch.setattr(forkserver, "PRELOAD", ("__main__",))
    monkeypatch.setattr(_server(), "_preload_modules", ["__main__"])
    forkserver.stop()
    forkserver.ensure_running()
    child = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(300,))
    child.start()
    let_go = threading.Thread(target=forkserver.stop, daemon=True)
    try:
        let_go.start()
        let_go.join(60)
        assert not let_go.is_alive(), "stop() waited for the server's child"
    finally:
        child.terminate()
        child.join(30)
        forkserver.stop()


def test_start_method_and_rendezvous(tmp_path: Path) -> None:
    from jupyter_trainmate.distributed.launch import launch_config

    assert forkserver.start_method("gloo") == "forkserver"  # Linux
    assert forkserver.start_method("nccl") == "spawn"
    config = launch_config(2, tmp_path, "forkserver")
    assert config.start_method == "forkserver"
    assert config.rdzv_backend == "static"
    assert config.rdzv_configs["rank"] == 0
    host, port = config.rdzv_endpoint.split(":")
    assert host == "localhost"
    assert int(port) > 0
    assert launch_config(2, tmp_path).rdzv_endpoint != config.rdzv_endpoint  # a port each


def test_the_root_cause_is_the_error_file_written_first(tmp_path: Path) -> None:
    """Rank 1 raised; rank 0 failed a few milliseconds later because rank 1 had gone: the
    launcher found rank 0 first, the cell names rank 1."""
    from jupyter_trainmate.distributed.launch import _root_cause

    logs = tmp_path / "logs"
    for rank, (message, when) in enumerate(
        [("RuntimeError: Connection closed by peer", 2_000_000_000), ("ValueError: boom", 1)]
    ):
        folder = logs / "run_x" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        path = folder / "error.json"
        path.write_text(json.dumps({"message": {"message": message}}))
        os.utime(path, ns=(when, when))
    reported = {"message": {"message": "RuntimeError: Connection closed by peer"}}
    rank, data = _root_cause(logs, 0, reported)
    assert (rank, data["message"]["message"]) == (1, "ValueError: boom")
    assert _root_cause(tmp_path / "none", 0, reported) == (0, reported)  # no file: as reported


def test_a_process_without_ipython_does_not_import_it_for_the_cell_id() -> None:
    code = (
        "import sys\n"
        "from jupyter_trainmate.runtime.status import current_cell_id\n"
        "assert current_cell_id() is None\n"
        "assert 'IPython' not in sys.modules, 'imported IPython'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
