"""The server extension through pytest-jupyter's real Jupyter server, authentication on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

import jupyter_trainmate
from jupyter_trainmate.monitor.fake import FakeGpuSource
from jupyter_trainmate.server.handlers import MetricsState

Fetch = Callable[..., Awaitable[Any]]


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_trainmate": True}}}


@pytest.fixture
def state(jp_serverapp: Any) -> MetricsState:
    result: MetricsState = jp_serverapp.web_app.settings["trainmate"]
    return result


async def test_version_with_token(jp_fetch: Fetch) -> None:
    response = await jp_fetch("trainmate", "api", "version")
    assert response.code == 200
    assert json.loads(response.body) == {
        "name": "jupyter_trainmate",
        "version": jupyter_trainmate.__version__,
    }


@pytest.mark.parametrize("endpoint", ["version", "metrics"])
async def test_without_token_is_403(
    endpoint: str, jp_http_port: int, jp_base_url: str, jp_fetch: Fetch
) -> None:
    await jp_fetch("api", "status")  # the server is up
    url = f"http://localhost:{jp_http_port}{jp_base_url}trainmate/api/{endpoint}"
    with pytest.raises(HTTPClientError) as exc:
        await AsyncHTTPClient().fetch(url)
    assert exc.value.code == 403


async def test_no_nvml_is_an_answer_with_host_metrics(jp_fetch: Fetch, state: MetricsState) -> None:
    report = state.gpu.sample()
    if report.available:
        pytest.skip("this machine has NVML")
    body = json.loads((await jp_fetch("trainmate", "api", "metrics")).body)
    assert body["gpu"]["available"] is False
    assert body["gpu"]["source"] == "nvml"
    assert "NVML" in body["gpu"]["reason"]
    assert body["gpu"]["gpus"] == []
    host = body["host"]
    assert host["memory_total_bytes"] == min(
        psutil.virtual_memory().total, host["memory_total_bytes"]
    )
    assert host["memory_total_bytes"] > 0
    assert 0 <= host["cpu_percent"] <= 100
    assert host["cpus"] >= 1


async def test_fake_gpus_give_known_numbers(jp_fetch: Fetch, state: MetricsState) -> None:
    state.gpu = FakeGpuSource.from_json(
        json.dumps(
            [
                {"name": "Fake H200", "utilization_pct": 87.0, "memory_used_bytes": 5 * 2**30,
                 "memory_total_bytes": 141 * 2**30, "temperature_c": 55.0, "power_w": 412.5},
                {"name": "Fake A10G", "utilization_pct": 3.0},
            ]
        )
    )  # fmt: skip
    state._cached = None
    body = json.loads((await jp_fetch("trainmate", "api", "metrics")).body)
    gpus = body["gpu"]["gpus"]
    assert body["gpu"]["available"] is True
    assert body["gpu"]["source"] == "fake"
    assert [g["name"] for g in gpus] == ["Fake H200", "Fake A10G"]
    assert gpus[0]["utilization_pct"] == 87.0
    assert gpus[0]["memory_used_bytes"] == 5 * 2**30
    assert gpus[0]["memory_total_bytes"] == 141 * 2**30
    assert gpus[0]["temperature_c"] == 55.0
    assert gpus[0]["power_w"] == 412.5


def _status(directory: Path, pid: int, started: float, name: str) -> Path:
    path = directory / f"{pid}-{name}.json"
    record = {"pid": pid, "pid_started": started, "notebook": f"{name}.ipynb", "run_name": name,
              "started": time.time(), "steps": 3, "fraction": 0.5}  # fmt: skip
    path.write_text(json.dumps(record))
    return path


async def test_runs_lists_live_processes_and_cleans_dead_ones(
    jp_fetch: Fetch, state: MetricsState
) -> None:
    state.runs_dir.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = psutil.Process()
    live = _status(state.runs_dir, os.getpid(), me.create_time(), "live")
    gone = _status(state.runs_dir, dead.pid, time.time() - 5, "gone")
    reused = _status(state.runs_dir, os.getpid(), me.create_time() - 3600, "reused")
    state._cached = None
    body = json.loads((await jp_fetch("trainmate", "api", "metrics")).body)
    assert [r["run_name"] for r in body["runs"]] == ["live"]
    assert body["runs"][0]["notebook"] == "live.ipynb"
    assert live.exists()
    assert not gone.exists()
    assert not reused.exists()
