"""Where the launch time of `%%train --procs 2` goes: time stamps in the notebook process and in
each worker, one table per run.

The notebook's side is timed by wrapping the launcher's steps in this process (payload, the
elastic agent's rendezvous, starting the workers, its monitor loop, the exit barrier, the
launcher's return, the results loaded back). The workers are timed by a `sitecustomize` module
this script writes to a temporary folder on PYTHONPATH (the spawned interpreters inherit it): it
notes when the interpreter started (`/proc/self/stat`), when `site` ran, the start and end of
the first import of a few packages (torch, IPython, libcst, the worker module...), the steps of
multiprocessing's spawn bootstrap (preparation: re-importing the parent's `__main__`; unpickling
the target) and the worker's own steps (process group, payload, rewrite and run, teardown).
Every stamp is `time.time()`, so the parent's and the workers' line up.

    python benchmarks/procs_phases.py [--runs 2] [--importtime]

`--importtime` also writes each worker's `python -X importtime` report (largest cumulative
imports printed) .
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SITE = r"""
import os, sys, time, json
_T0 = time.time()
_DIR = os.environ.get("TM_TRACE_DIR")
if _DIR and os.environ.get("TM_TRACE_PARENT") != str(os.getpid()):
    _events = []
    _KIND = ["worker" if "--multiprocessing-fork" in sys.argv else "server"]
    def _mark(name, t=None):
        _events.append((name, time.time() if t is None else t))
    def _flush():
        path = os.path.join(_DIR, f"{_KIND[0]}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(_events, f)
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        _mark("process created", time.time() - up + ticks / os.sysconf("SC_CLK_TCK"))
    except OSError:
        pass
    _mark("site (interpreter up)", _T0)
    import importlib.abc, importlib.machinery
    WATCH = {"torch", "IPython", "libcst", "cloudpickle", "jupyter_trainmate",
             "jupyter_trainmate.distributed.worker", "jupyter_trainmate.runner",
             "torch._dynamo", "torch.distributed", "numpy", "__mp_main__", "ipykernel",
             "jupyter_trainmate.rewrite", "torch.nn.parallel"}
    PATCH = {}
    class _Loader(importlib.abc.Loader):
        def __init__(self, inner, name):
            self.inner, self.name = inner, name
        def create_module(self, spec):
            return self.inner.create_module(spec)
        def exec_module(self, module):
            _mark("import " + self.name + " start")
            try:
                self.inner.exec_module(module)
            finally:
                _mark("import " + self.name + " end")
                _flush()
            fn = PATCH.get(self.name)
            if fn:
                fn(module)
        def __getattr__(self, name):
            return getattr(self.inner, name)
    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in WATCH or name in sys.modules:
                return None
            WATCH.discard(name)
            for finder in sys.meta_path:
                if finder is self:
                    continue
                spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
                if spec is not None:
                    if spec.loader is not None:
                        spec.loader = _Loader(spec.loader, name)
                    return spec
            return None
    sys.meta_path.insert(0, _Finder())

    def _wrap(obj, attr, label):
        inner = getattr(obj, attr)
        def wrapped(*a, **k):
            _mark(label + " start")
            try:
                return inner(*a, **k)
            finally:
                _mark(label + " end")
                _flush()
        setattr(obj, attr, wrapped)

    import multiprocessing.spawn as _spawn
    _prep = _spawn.prepare
    def _prepare(data):
        _mark("spawn: prepare (parent's sys.path, __main__) start")
        _prep(data)
        _mark("spawn: prepare end; unpickling the target")
    _spawn.prepare = _prepare

    def _forkserver(module):
        inner = module._serve_one
        def serve_one(*a, **k):
            _events.clear()
            _KIND[0] = "worker"
            _mark("forked by the fork server")
            return inner(*a, **k)
        module._serve_one = serve_one
    import multiprocessing.forkserver
    _forkserver(multiprocessing.forkserver)

    def _dist(module):
        _wrap(module, "init_process_group", "init_process_group")
        _wrap(module, "destroy_process_group", "destroy_process_group")
    PATCH["torch.distributed"] = _dist
    def _worker(module):
        _wrap(module, "load", "payload load")
        _wrap(module, "prepare", "DDP wrap, loaders")
        inner = module._exit_now
        def exit_now():
            _mark("os._exit")
            _flush()
            inner()
        module._exit_now = exit_now
        import torch.distributed.elastic.multiprocessing.api as api
        _wrap(api, "_wrap", "elastic _wrap (redirects, record, entry)")
    PATCH["jupyter_trainmate.distributed.worker"] = _worker
    def _runner(module):
        _wrap(module, "run_cell", "run_cell (rewrite, session, cell)")
        _wrap(module, "rewrite_cell", "rewrite_cell")
    PATCH["jupyter_trainmate.runner"] = _runner
    import atexit
    atexit.register(_flush)
"""


class Parent:
    """Time stamps of the notebook's side, by wrapping functions in this process."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        self.events.append((name, time.time()))

    def wrap(self, obj: Any, attr: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(obj, attr)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.mark(label + " start")
            try:
                return inner(*args, **kwargs)
            finally:
                self.mark(label + " end")

        setattr(obj, attr, wrapped)

    def install(self) -> None:
        from torch.distributed.elastic.agent.server import api as agent_api
        from torch.distributed.elastic.agent.server import local_elastic_agent as local
        from torch.distributed.elastic.multiprocessing import api as mp_api
        from torch.distributed.launcher import api as launcher

        from jupyter_trainmate.distributed import launch

        self.wrap(launch, "build", "payload build (cloudpickle)")
        self.wrap(launch, "_launch", "launch (elastic_launch)")
        self.wrap(launch, "apply", "results applied")
        self.wrap(launcher, "launch_agent", "launch_agent")
        self.wrap(agent_api.SimpleElasticAgent, "_rendezvous", "agent: rendezvous")
        self.wrap(local.LocalElasticAgent, "_start_workers", "agent: start workers")
        self.wrap(agent_api.SimpleElasticAgent, "_exit_barrier", "agent: exit barrier")
        self.wrap(mp_api.PContext, "close", "pcontext close")
        parent = self
        inner = local.LocalElasticAgent._monitor_workers
        state = {"last": ""}

        def monitor(agent: Any, group: Any) -> Any:
            result = inner(agent, group)
            if result.state.name != state["last"]:
                state["last"] = result.state.name
                parent.mark(f"agent: workers {result.state.name}")
            return result

        local.LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]


def table(parent: Parent, folder: Path, start: float, end: float) -> None:
    rows = [("notebook", name, t) for name, t in parent.events]
    for path in sorted(folder.glob("*.json")):
        kind, pid = path.stem.split("-")
        for name, t in json.loads(path.read_text()):
            rows.append((f"{kind} {pid}", name, t))
    rows = sorted(row for row in rows if start - 0.001 <= row[2] <= end)
    for who, name, t in sorted(rows, key=lambda row: row[2]):
        print(f"{t - start:8.3f}  {who:14} {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--importtime", action="store_true")
    args = parser.parse_args()
    trace = Path(tempfile.mkdtemp(prefix="procs-phases-"))
    site = trace / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    sys.path.append(str(site))  # a fork server gets the notebook's sys.path as its PYTHONPATH
    os.environ["TM_TRACE_PARENT"] = str(os.getpid())
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    if args.importtime:
        os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
    sys.path.insert(0, str(Path(__file__).parent))
    from IPython.core.interactiveshell import InteractiveShell
    from procs_launch import LOOP, SMALL

    parent = Parent()
    parent.install()
    os.chdir(trace)
    runs = trace / "stamps"
    runs.mkdir()
    os.environ["TM_TRACE_DIR"] = str(runs)  # one folder: a fork server outlives a run
    for run in range(args.runs):
        InteractiveShell.clear_instance()
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "jupyter_trainmate")
        ip.run_cell(SMALL).raise_error()
        parent.events.clear()
        print(f"--- run {run}, load {os.getloadavg()}")
        start = time.time()
        parent.mark("cell start")
        ip.run_cell("%%train --procs 2 --backend gloo --display off\n" + LOOP).raise_error()
        parent.mark("cell end")
        table(parent, runs, start, time.time())


if __name__ == "__main__":
    main()
