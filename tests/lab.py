"""A real JupyterLab server for browser tests: started on 127.0.0.1 with a token, stopped after."""

from __future__ import annotations

import importlib.util
import os
import secrets
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
BUILD = Path(__file__).resolve().parent.parent / "jupyter_trainmate" / "labextension"
# Flags for a closed network: without the background-networking ones Chromium keeps dialling out.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass(frozen=True)
class Lab:
    url: str
    token: str
    root: Path
    runtime: Path

    def lab_url(self, path: str = "lab") -> str:
        return f"{self.url}{path}?token={self.token}"


def _make_lab() -> Any:
    """scripts/lab.py as a module (scripts/ is not a package)."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "lab.py"
    spec = importlib.util.spec_from_file_location("trainmate_make_lab", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def running_lab(
    tmp: Path, timeout: float = 60.0, env: dict[str, str] | None = None
) -> Iterator[Lab]:
    root, runtime = tmp / "root", tmp / "runtime"
    root.mkdir()
    # No "get notified about Jupyter news?" toast over the screenshots (and no call out for news).
    news = (
        tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    )
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')
    token = secrets.token_hex(16)
    port = _free_port()
    # This checkout's lab extension build, whichever checkout the virtualenv's link names (a git
    # worktree shares the venv of another): the first `labextensions/` on JUPYTER_PATH wins.
    extensions = tmp / "jupyter-path" / "labextensions"
    extensions.mkdir(parents=True)
    (extensions / "jupyter-trainmate").symlink_to(BUILD, target_is_directory=True)
    jupyter_path = os.pathsep.join(
        p for p in (str(extensions.parent), os.environ.get("JUPYTER_PATH")) if p
    )
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "JUPYTER_PATH": jupyter_path,
        **(env or {}),
    }
    # The command `make lab` runs (scripts/lab.py), on this test's own folders and port.
    cmd = _make_lab().command(root, [
        "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        f"--LabApp.user_settings_dir={tmp / 'settings'}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ])  # fmt: skip
    log = (tmp / "lab.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"JupyterLab did not start:\n{(tmp / 'lab.log').read_text()}"
                    ) from None
                time.sleep(0.25)
        yield Lab(url, token, root, runtime)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
