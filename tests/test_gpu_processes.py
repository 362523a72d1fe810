"""GPU memory by notebook: the fake NVML process list mapped to real kernels of a test server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_trainmate.monitor import GpuProcess
from jupyter_trainmate.monitor.fake import FakeGpuSource
from jupyter_trainmate.server.gpu_processes import KernelInfo, gpu_memory_by_notebook
from jupyter_trainmate.server.handlers import MetricsState
from jupyter_trainmate.server.runs import list_ended

Fetch = Callable[..., Awaitable[Any]]
GiB = 2**30


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_trainmate": True}}}


async def _start_session(fetch: Fetch, path: str) -> str:
    body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}
    reply = await fetch("api", "sessions", method="POST", body=json.dumps(body))
    kernel_id: str = json.loads(reply.body)["kernel"]["id"]
    return kernel_id


def _kernel_process(kernel_id: str) -> psutil.Process:
    """Found independently of the server's answer: the process whose command line names the
    kernel's connection file."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            if any(f"kernel-{kernel_id}.json" in part for part in process.info["cmdline"] or ()):
                return process
        time.sleep(0.1)
    raise AssertionError(f"no process for kernel {kernel_id}")


async def test_gpu_memory_by_notebook_maps_real_kernels(
    jp_fetch: Fetch, jp_serverapp: Any, jp_http_port: int, jp_base_url: str
) -> None:
    state: MetricsState = jp_serverapp.web_app.settings["trainmate"]
    first = await _start_session(jp_fetch, "first.ipynb")
    second = await _start_session(jp_fetch, "sub/second.ipynb")
    first_pid, second_pid = _kernel_process(first).pid, _kernel_process(second).pid
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state.gpu = FakeGpuSource.from_json(
            json.dumps([{"name": "Fake A", "memory_total_bytes": 80 * GiB}, {"name": "Fake B"}])
        )
        state.gpu.given_processes = (
            GpuProcess(0, first_pid, 3 * GiB),
            GpuProcess(1, first_pid, 1 * GiB),
            GpuProcess(0, second_pid, 10 * GiB),
            GpuProcess(1, stranger.pid, 2 * GiB),
        )
        state._cached = None
        body = json.loads((await jp_fetch("trainmate", "api", "gpu-processes")).body)
        assert body["available"] is True
        assert body["source"] == "fake"
        assert [g["name"] for g in body["gpus"]] == ["Fake A", "Fake B"]
        assert body["gpus"][0]["memory_total_bytes"] == 80 * GiB
        notebooks = body["notebooks"]
        assert [n["path"] for n in notebooks] == ["sub/second.ipynb", "first.ipynb"]  # most first
        assert [n["kernel_id"] for n in notebooks] == [second, first]
        assert notebooks[1]["used_bytes"] == 4 * GiB
        assert notebooks[1]["gpus"] == [
            {"gpu": 0, "used_bytes": 3 * GiB},
            {"gpu": 1, "used_bytes": 1 * GiB},
        ]
        assert notebooks[1]["pids"] == [first_pid]
        assert notebooks[0]["used_bytes"] == 10 * GiB
        for notebook in notebooks:
            assert notebook["kernel_name"] == "python3"
            assert notebook["execution_state"] in {"idle", "starting", "busy"}
            assert notebook["last_activity"] == pytest.approx(time.time(), abs=120)
        [other] = body["others"]
        assert other["pid"] == stranger.pid
        assert other["gpu"] == 1
        assert other["used_bytes"] == 2 * GiB
        assert "time.sleep(60)" in other["command"]

        # Shutting the kernel down (Jupyter's own API, as the sidebar's action does) frees it.
        await jp_fetch("api", "kernels", second, method="DELETE")
        deadline = time.monotonic() + 20
        while psutil.pid_exists(second_pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not psutil.pid_exists(second_pid)
        state.gpu.given_processes = tuple(
            p for p in state.gpu.given_processes if p.pid != second_pid
        )
        body = json.loads((await jp_fetch("trainmate", "api", "gpu-processes")).body)
        assert [n["path"] for n in body["notebooks"]] == ["first.ipynb"]

        # Authenticated like the other endpoints.
        url = f"http://localhost:{jp_http_port}{jp_base_url}trainmate/api/gpu-processes"
        with pytest.raises(HTTPClientError) as exc:
            await AsyncHTTPClient().fetch(url)
        assert exc.value.code == 403
    finally:
        stranger.kill()
        stranger.wait()


def test_a_kernels_child_process_counts_for_its_notebook() -> None:
    """A DataLoader worker or a subprocess the notebook started holds memory for the notebook."""
    me = psutil.Process()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kernel = KernelInfo("k1", "python3", me.pid, "busy", time.time(), "nb.ipynb")
        found = gpu_memory_by_notebook(
            (GpuProcess(0, child.pid, 5 * GiB), GpuProcess(0, me.pid, None)), [kernel]
        )
        [notebook] = found["notebooks"]
        assert notebook["path"] == "nb.ipynb"
        assert notebook["pids"] == sorted([me.pid, child.pid])
        assert notebook["used_bytes"] is None  # one process's memory is unknown: no false total
        assert found["others"] == []
    finally:
        child.kill()
        child.wait()


def test_fake_processes_file_lists_live_processes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    listing = tmp_path / "procs.json"
    monkeypatch.setenv("TRAINMATE_FAKE_GPU_PROCESSES", str(listing))
    source = FakeGpuSource.from_json("[{}]")
    assert source.processes() == ()  # not written yet
    me = psutil.Process().pid
    listing.write_text(json.dumps([{"pid": me, "used_bytes": 7}, {"pid": gone.pid, "gpu": 0}]))
    assert source.processes() == (GpuProcess(0, me, 7),)
    assert source.sample().source == "fake"


def test_ended_runs_expire(tmp_path: Path) -> None:
    folder = tmp_path / "trainmate-ended"
    folder.mkdir()
    now = time.time()
    (folder / "old.json").write_text(json.dumps({"id": "old", "ended": now - 700}))
    (folder / "new.json").write_text(json.dumps({"id": "new", "ended": now - 5}))
    (folder / "bad.json").write_text("{")
    assert [r["id"] for r in list_ended(tmp_path / "trainmate-runs")] == ["new"]
    assert not (folder / "old.json").exists()


@pytest.mark.gpu
def test_nvml_lists_a_kernels_cuda_memory() -> None:
    """The real NVML process list, mapped to a real kernel, against its `memory_reserved`."""
    from jupyter_client.manager import start_new_kernel

    from jupyter_trainmate.monitor.nvml import NvmlSource

    manager, client = start_new_kernel(kernel_name="python3")
    source = NvmlSource()
    try:
        reply = client.execute_interactive(
            "import torch\n"
            "x = torch.empty(512 * 2**20, dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize()",
            user_expressions={"reserved": "torch.cuda.memory_reserved()"},
            timeout=120,
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        reserved = int(reply["content"]["user_expressions"]["reserved"]["data"]["text/plain"])
        assert reserved >= 512 * 2**20
        kernel = KernelInfo("k1", "python3", manager.provisioner.process.pid, "idle", None, "nb")
        deadline = time.monotonic() + 10
        found = gpu_memory_by_notebook(source.processes(), [kernel])
        while not found["notebooks"] and time.monotonic() < deadline:
            time.sleep(0.2)
            found = gpu_memory_by_notebook(source.processes(), [kernel])
        [notebook] = found["notebooks"]
        used = notebook["used_bytes"]
        assert used is not None
        # NVML counts the CUDA context on top of the caching allocator's reserve.
        assert reserved <= used < reserved + 2 * GiB
    finally:
        source.close()
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_nvml_processes_per_gpu_with_unknown_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """NvmlSource.processes() over a stand-in pynvml: every GPU's list, the driver's "not
    available" as None, and a GPU whose query fails left out, never an exception."""
    import types

    from jupyter_trainmate.monitor.nvml import NvmlSource

    class NVMLError(Exception):
        pass

    def processes(handle: int) -> list[Any]:
        if handle == 2:
            raise NVMLError("Not Supported")
        info = types.SimpleNamespace
        return [info(pid=100 + handle, usedGpuMemory=GiB), info(pid=7, usedGpuMemory=None)]

    fake = types.ModuleType("pynvml")
    fake.NVMLError = NVMLError  # type: ignore[attr-defined]
    fake.nvmlInit = lambda: None  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = lambda: 3  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    fake.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource()
    assert source.processes() == (
        GpuProcess(0, 100, GiB),
        GpuProcess(0, 7, None),
        GpuProcess(1, 101, GiB),
        GpuProcess(1, 7, None),
    )
    source.close()
    assert source.processes() == ()
