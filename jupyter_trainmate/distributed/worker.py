"""
One worker of `%%train --procs N`: started by the elastic launcher (spawned), it joins the process
group, loads the cell and the notebook state it reads (`workers.payload`), makes them
data-parallel and runs the cell through the ordinary `%%train` runtime (`runner.run_cell`).

Data-parallel means, for the objects the cell reads by name:

- each model with trainable parameters moves to the rank's device and is wrapped in
  `DistributedDataParallel` (under the same name; attributes the wrapper lacks are the model's);
  the gradients of an accumulating step are not reduced (`require_backward_grad_sync`, what
  `no_sync()` sets, decided before each forward from the run's accumulation window);
- each optimizer keeps its parameters (the wrapped model's own) and its state, moved with them;
- each `DataLoader` is rebuilt with the same arguments and a `DistributedSampler` (shuffling and
  its seed carried over; `Batches.epoch` calls `set_epoch` at each epoch);
- only rank 0 writes checkpoints (of the unwrapped model, see `checkpoint.trainable_objects`) and
  the run record.

At the end each rank writes its summary, and rank 0 the trained state (the states of the models,
optimizers and schedulers, and the variables the cell assigned or whose contents it changed) to
the run's folder; the notebook process loads them into its own objects (`launch`).
`record` writes a failing rank's traceback to the elastic error file the launcher reads.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import json
import os
import pickle
import signal
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from ..monitor.host import usable_cpus
from ..runtime.accumulation import Accumulation
from ..runtime.checkpoint import trainable_objects
from ..workers.payload import Payload, load
from ..workers.results import Before, collect
from .forkserver import restore

if TYPE_CHECKING:
    from ..runtime.session import TrainSession

RESULT = "result.pkl"  # rank 0's trained state


def summary_file(rank: int) -> str:
    return f"summary-{rank}.pkl"


@dataclasses.dataclass(frozen=True)
class Job:
    """What the notebook process tells every worker besides the payload."""

    options: Any  # TrainOptions, for the workers
    backend: str
    seed: int  # the DistributedSampler seed of loaders without their own generator
    # the kernel's values of variables a worker forked from the fork server puts back
    environ: dict[str, str | None] = dataclasses.field(default_factory=dict)


class TrainmateDDP(DistributedDataParallel):
    """DDP that skips the gradient all-reduce inside an accumulation window, and reads the
    model's own attributes (`model.encoder`) through."""

    accumulation: Accumulation | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        window = self.accumulation
        if window is not None and window.every > 1:
            # what no_sync() sets: this forward's backward completes the window, or not
            self.require_backward_grad_sync = (
                window.pending + 1 >= window.every or window.last_batch
            )
        return super().forward(*args, **kwargs)  # type: ignore[no-untyped-call]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def _interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt  # the launcher stops workers with SIGTERM: checkpoint, then leave


def shard(
    loader: DataLoader[Any], rank: int, world: int, seed: int
) -> tuple[DataLoader[Any], str | None]:
    """The loader rebuilt with a `DistributedSampler` for this rank, or itself and why not."""
    if isinstance(loader.sampler, DistributedSampler):
        return loader, None
    if isinstance(loader.dataset, IterableDataset):
        return loader, "an IterableDataset: every rank reads all of it (shard it yourself)"
    if loader.batch_size is None:
        return loader, "a custom batch_sampler: every rank reads all of it"
    shuffle = isinstance(loader.sampler, RandomSampler)
    if not shuffle and type(loader.sampler).__name__ != "SequentialSampler":
        return loader, f"a {type(loader.sampler).__name__}: every rank reads all of it"
    if shuffle and loader.generator is not None:
        seed = loader.generator.initial_seed()
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset,
        num_replicas=world,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=loader.drop_last,
    )
    workers = loader.num_workers
    rebuilt = DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=loader.persistent_workers,
    )
    return rebuilt, None


def prepare(
    namespace: dict[str, Any], device: torch.device, rank: int, world: int, seed: int
) -> tuple[list[TrainmateDDP], list[str]]:
    """Make the namespace's models, optimizers and loaders data-parallel (see the module);
    the wrappers made, and notes for the run's events."""
    objects = trainable_objects(namespace)
    wrapped: dict[int, TrainmateDDP] = {}
    for name, model in objects["models"].items():
        model.to(device)
        if not any(p.requires_grad for p in model.parameters()):
            continue  # a loss function, a frozen model: nothing to reduce
        if id(model) not in wrapped:
            ids = [device.index] if device.type == "cuda" else None
            wrapped[id(model)] = TrainmateDDP(model, device_ids=ids)
        namespace[name] = wrapped[id(model)]
    if device.type != "cpu":
        for optimizer in objects["optimizers"].values():
            optimizer.load_state_dict(optimizer.state_dict())  # its state, where its params are
    notes = []
    for name, value in list(namespace.items()):
        if isinstance(value, DataLoader) and not name.startswith("_"):
            namespace[name], why = shard(value, rank, world, seed)
            if why is not None:
                notes.append(f"--procs: {name} is not sharded: {why}")
    return list(wrapped.values()), notes


def _not_sent_back(name: str, value: object) -> bool:
    """The worker's own objects: the rebuilt loaders, the wrappers, the session."""
    return isinstance(value, DataLoader | TrainmateDDP) or name == "__trainmate__"


@record
def main(payload_path: str, folder: str) -> None:
    """The worker's entrypoint (module level: the spawned process imports it by name)."""
    from ..runner import RunHooks, run_cell

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    out = Path(folder)
    payload: Payload = cloudpickle.loads(Path(payload_path).read_bytes())
    job: Job = payload.extra["job"]
    restore(job.environ)
    # Each rank's status file (progress, read by the notebook process) in its own folder.
    os.environ["JUPYTER_RUNTIME_DIR"] = str(out / f"rank-{rank}")
    signal.signal(signal.SIGTERM, _interrupt)
    if isinstance(sys.stdout, io.TextIOWrapper):  # a file: rank 0's lines reach the notebook
        sys.stdout.reconfigure(line_buffering=True)
    if "OMP_NUM_THREADS" not in os.environ:  # the cores shared out (torchrun sets 1 thread)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, usable_cpus() // local_world))
    if job.backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    namespace = load(payload)
    wrapped, notes = prepare(namespace, device, rank, world, job.seed)
    before = Before(namespace)

    sessions: list[TrainSession] = []

    def wire(session: TrainSession) -> None:
        sessions.append(session)
        for model in wrapped:
            model.accumulation = session.accumulation
        session.checkpoints.writes = rank == 0
        for note in notes:
            session.event(note)

    options = dataclasses.replace(
        job.options, procs=None, backend="auto", display="off", tensorboard="off"
    )
    try:
        summary = run_cell(
            payload.source,
            payload.filename,
            options,
            namespace,
            hooks=RunHooks(
                on_created=wire,
                write_record=rank == 0,
                keep_record=lambda record: _keep_record(out, record),
                # the record's options are the worker's (no --procs): it says it was data-parallel
                record=lambda: {
                    "procs": {
                        "ranks": world,
                        "backend": job.backend,
                        "option": job.options.procs,
                        "rank": rank,
                    }
                },
            ),
        )
    except BaseException:
        finish_checkpoints(sessions)
        raise
    info = sessions[0].loader_info if sessions else None
    batch = info.batch_size if info is not None else None
    (out / summary_file(rank)).write_bytes(pickle.dumps({"summary": summary, "batch": batch}))
    if rank == 0:
        data = collect(namespace, before, skip=_not_sent_back)
        partial = out / (RESULT + ".part")
        partial.write_bytes(data)
        partial.replace(out / RESULT)
    dist.destroy_process_group()
    # Done, and everything is on disk: when the launcher has the return value, leave without
    # the interpreter's teardown of torch, libcst and the rest (seconds on a busy machine, and
    # the launcher waits for every worker to exit). The last atexit handler registered runs first.
    atexit.register(_exit_now)


RECORD = "record.json"


def _keep_record(out: Path, record: dict[str, Any]) -> None:
    """Rank 0's run record, for the notebook's process to append with every rank's samples."""
    partial = out / (RECORD + ".part")
    partial.write_text(json.dumps(record, default=str))
    partial.replace(out / RECORD)


def finish_checkpoints(sessions: list[TrainSession]) -> None:
    """A rank leaving on an error or an interrupt first lets its last checkpoint reach the disk.

    When another rank failed, the launcher stops this one with SIGTERM (`_interrupt`); arriving
    while the run waits for its checkpoint writer (a daemon thread), it would end the process with
    the write unfinished, and rank 0's latest checkpoint would be lost. From here on SIGTERM is
    ignored (the launcher kills with SIGKILL after its own timeout)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for session in sessions:
        with contextlib.suppress(Exception):  # a failed write was reported by the run
            session.checkpoints.wait()


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
