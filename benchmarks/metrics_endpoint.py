"""The sidebar's metrics endpoint under load, against a trivial endpoint of the same server.

Starts a real Jupyter server on 127.0.0.1 (token auth, the extension enabled), then:
1. latency: 20 concurrent pollers, each sending 50 requests back to back, to
   `/trainmate/api/metrics` and, in the same run, to Jupyter's own `/api/status` (the baseline);
   p50 and p95 of each and their ratio;
2. server CPU at one poll per second for 20 s: the server process's CPU time per wall second while
   polling the metrics endpoint, against the same server idle for 20 s.
Loopback only; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
import psutil

POLLERS = 20
REQUESTS = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    token, port = secrets.token_hex(16), _free_port()
    cmd = [
        sys.executable, "-m", "jupyter", "server", "--no-browser", "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={tmp}",
    ]  # fmt: skip
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{url}api/status?token={token}", timeout=1).close()
            return proc, url, token
        except OSError:
            time.sleep(0.25)
    proc.kill()
    raise RuntimeError("the Jupyter server did not start")


async def latencies(url: str, token: str, path: str) -> list[float]:
    headers = {"Authorization": f"token {token}"}
    found: list[float] = []
    async with httpx.AsyncClient(headers=headers, timeout=30) as client:

        async def poller() -> None:
            for _ in range(REQUESTS):
                started = time.perf_counter()
                response = await client.get(url + path)
                response.raise_for_status()
                found.append(time.perf_counter() - started)

        await asyncio.gather(*(poller() for _ in range(POLLERS)))
    return found


def cpu_share(proc: psutil.Process, seconds: float, poll: str | None, token: str) -> float:
    before, started = proc.cpu_times(), time.perf_counter()
    deadline = started + seconds
    with httpx.Client(headers={"Authorization": f"token {token}"}, timeout=10) as client:
        while time.perf_counter() < deadline:
            if poll is not None:
                client.get(poll).raise_for_status()
            time.sleep(1.0)
    after, wall = proc.cpu_times(), time.perf_counter() - started
    return ((after.user - before.user) + (after.system - before.system)) / wall


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, token = start_server(Path(tmp))
        try:
            asyncio.run(latencies(url, token, "api/status"))  # warm-up
            asyncio.run(latencies(url, token, "trainmate/api/metrics"))
            base = asyncio.run(latencies(url, token, "api/status"))
            metrics = asyncio.run(latencies(url, token, "trainmate/api/metrics"))

            def q(values: list[float], p: int) -> float:
                return statistics.quantiles(values, n=100)[p - 1] * 1000

            print(
                f"metrics endpoint, {POLLERS} concurrent pollers x {REQUESTS} requests: "
                f"p50 {q(metrics, 50):.1f} ms, p95 {q(metrics, 95):.1f} ms; /api/status p50 "
                f"{q(base, 50):.1f} ms, p95 {q(base, 95):.1f} ms; ratio p50 "
                f"{q(metrics, 50) / q(base, 50):.2f}, p95 {q(metrics, 95) / q(base, 95):.2f}"
            )
            server = psutil.Process(proc.pid)
            idle = cpu_share(server, 20, None, token)
            polled = cpu_share(server, 20, url + "trainmate/api/metrics", token)
            print(
                f"server CPU at 1 poll/s: {polled * 100:.2f}% of a core (idle {idle * 100:.2f}%, "
                f"difference {(polled - idle) * 100:.2f} points)"
            )
        finally:
            proc.terminate()
            proc.wait(timeout=15)


if __name__ == "__main__":
    main()
