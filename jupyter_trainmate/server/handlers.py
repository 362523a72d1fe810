"""REST handlers. Every one is `@tornado.web.authenticated`: no token, no answer (403).

Sampling (NVML, psutil, status files) runs in worker threads, never on the event loop, and one
sample serves every poller for `MAX_AGE_S`: twenty open browser tabs cost one NVML query.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .._version import __version__
from ..monitor import GpuSource
from ..monitor.fake import ENV_VAR, FakeGpuSource
from ..monitor.host import HostSource
from ..monitor.nvml import NvmlSource
from .gpu_processes import sample_gpu_memory, server_kernels
from .runs import list_ended, list_runs

NAMESPACE = "trainmate/api"
MAX_AGE_S = 0.5


@dataclass
class MetricsState:
    """What the handlers share: the sources, the runs folder and the last sample."""

    gpu: GpuSource
    host: HostSource
    runs_dir: Path
    root_dir: Path | None = None
    _cached: dict[str, Any] | None = None
    _cached_at: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def create(cls, runs_dir: Path, root_dir: Path | None = None) -> MetricsState:
        fake = os.environ.get(ENV_VAR)
        gpu: GpuSource = FakeGpuSource.from_json(fake) if fake else NvmlSource()
        return cls(gpu=gpu, host=HostSource(), runs_dir=runs_dir, root_dir=root_dir)

    def _with_api_path(self, run: dict[str, Any]) -> dict[str, Any]:
        """Add `path`: the notebook relative to the server's root (what the lab opens), or None."""
        notebook, path = run.get("notebook"), None
        if notebook and self.root_dir is not None:
            try:
                path = Path(notebook).resolve().relative_to(self.root_dir.resolve()).as_posix()
            except ValueError:
                path = None  # outside the server's root: shown, not openable
        return {**run, "path": path}

    def _sample(self) -> dict[str, Any]:
        return {
            "time": time.time(),
            "gpu": asdict(self.gpu.sample()),
            "host": asdict(self.host.sample()),
            "runs": [self._with_api_path(run) for run in list_runs(self.runs_dir)],
        }

    async def ended(self) -> list[dict[str, Any]]:
        """The runs that ended lately (what the lab's notifications poll: no GPU query)."""
        found = await asyncio.to_thread(list_ended, self.runs_dir)
        return [self._with_api_path(run) for run in found]

    async def metrics(self) -> dict[str, Any]:
        async with self._lock:
            if self._cached is None or time.monotonic() - self._cached_at > MAX_AGE_S:
                self._cached = await asyncio.to_thread(self._sample)
                self._cached_at = time.monotonic()
            return self._cached


class VersionHandler(APIHandler):
    """`GET /trainmate/api/version`: which jupyter_trainmate the server runs."""

    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(json.dumps({"name": "jupyter_trainmate", "version": __version__}))


class MetricsHandler(APIHandler):
    """`GET /trainmate/api/metrics`: GPUs (or why none), host CPU and memory, runs in progress."""

    @tornado.web.authenticated
    async def get(self) -> None:
        state: MetricsState = self.settings["trainmate"]
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(await state.metrics()))


class EndedHandler(APIHandler):
    """`GET /trainmate/api/ended`: the `%%train` runs that ended in the last minutes, with their
    outcome, duration and final metrics (the lab shows a notification for each new one)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        state: MetricsState = self.settings["trainmate"]
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"ended": await state.ended()}))


class GpuProcessesHandler(APIHandler):
    """`GET /trainmate/api/gpu-processes`: GPU memory by notebook (this server's kernels, with
    their notebook, state and last activity) and the other processes holding GPU memory."""

    @tornado.web.authenticated
    async def get(self) -> None:
        state: MetricsState = self.settings["trainmate"]
        kernels = await server_kernels(self.kernel_manager, self.session_manager)
        found = await asyncio.to_thread(sample_gpu_memory, state.gpu, kernels)
        gpu = (await state.metrics())["gpu"]
        self.set_header("Cache-Control", "no-store")
        self.finish(
            json.dumps(
                {
                    "available": gpu["available"],
                    "source": gpu["source"],
                    "reason": gpu["reason"],
                    "gpus": [
                        {
                            k: g[k]
                            for k in ("index", "name", "memory_used_bytes", "memory_total_bytes")
                        }
                        for g in gpu["gpus"]
                    ],
                    **found,
                }
            )
        )


def handlers(base_url: str) -> list[tuple[str, type[APIHandler]]]:
    """The URL patterns of the extension under the server's `base_url`."""
    return [
        (url_path_join(base_url, NAMESPACE, "version"), VersionHandler),
        (url_path_join(base_url, NAMESPACE, "metrics"), MetricsHandler),
        (url_path_join(base_url, NAMESPACE, "gpu-processes"), GpuProcessesHandler),
        (url_path_join(base_url, NAMESPACE, "ended"), EndedHandler),
    ]
