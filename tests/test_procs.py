"""`%%train --procs N`: the cell data-parallel in spawned workers (gloo on the CPU, 2 ranks).

Each launch spawns two processes that import torch: the launches are few, and one launch serves
several assertions.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import last_run
from jupyter_trainmate.runtime.summary import RunSummary

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x = torch.randn(64, 8)
y = torch.randn(64, 1)

class MLP(nn.Module):  # a notebook class: it travels by value
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)

model = MLP()
model(x[:2])  # the kernel touched the model before the launch
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss_fn = nn.MSELoss()
loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
history = []

def train_step(xb, yb):  # a notebook function reading the notebook's model and optimizer
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    return loss
"""
LOOP = """
for epoch in range(3):
    for xb, yb in loader:
        loss = train_step(xb, yb)
    history.append(loss.item())
final_loss = loss.item()
"""


def shell(batch: int, setup: str = SETUP) -> InteractiveShell:
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(f"BATCH = {batch}\n" + setup).raise_error()
    return ip


def weights(ip: InteractiveShell) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in ip.user_ns["model"].state_dict().items()}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One `--procs 2` run (per-rank batch 8, accumulating 2) and the one-process run with the
    global batch (16) and the same sample order."""
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("procs")
        mp.chdir(folder)
        mp.delenv("JPY_SESSION_NAME", raising=False)
        one = shell(16)
        one.run_cell("%%train --display off --accumulate 2\n" + LOOP).raise_error()
        reference = weights(one)
        ip = shell(8)
        model, opt, history = ip.user_ns["model"], ip.user_ns["opt"], ip.user_ns["history"]
        before = weights(ip)
        result = ip.run_cell(
            "%%train --procs 2 --backend gloo --display off --accumulate 2\n" + LOOP
        )
        yield {
            "ip": ip,
            "result": result,
            "reference": reference,
            "before": before,
            "objects": (model, opt, history),
            "summary": last_run(),
            "folder": folder,
        }


def test_two_ranks_train_like_one_process_with_the_global_batch(two_ranks: dict[str, Any]) -> None:
    two_ranks["result"].raise_error()
    ip, reference = two_ranks["ip"], two_ranks["reference"]
    trained = weights(ip)
    assert any(not torch.equal(trained[k], two_ranks["before"][k]) for k in trained)
    for key, value in trained.items():
        torch.testing.assert_close(value, reference[key], rtol=1e-5, atol=1e-6)


def test_the_notebook_objects_hold_the_trained_run(two_ranks: dict[str, Any]) -> None:
    two_ranks["result"].raise_error()
    ip = two_ranks["ip"]
    model, opt, history = two_ranks["objects"]
    assert ip.user_ns["model"] is model  # loaded into the same objects
    assert ip.user_ns["opt"] is opt
    assert opt.state_dict()["state"], "the optimizer's momentum came back"
    momentum = opt.state_dict()["state"][0]["momentum_buffer"]
    assert momentum.shape == model.net[0].weight.shape
    assert ip.user_ns["history"] is history
    assert len(history) == 3
    assert isinstance(ip.user_ns["final_loss"], float)  # a variable the cell assigned
    summary: RunSummary = two_ranks["summary"]
    assert summary.outcome == "finished"
    assert summary.samples == 3 * 64  # both ranks' samples
    assert any("effective batch 32 = 8 per rank x 2 ranks x 2" in e for e in summary.events)


def test_the_run_record_says_it_ran_data_parallel(two_ranks: dict[str, Any]) -> None:
    """Rank 0's run record has the worker's own options (no --procs in them): the record names
    the ranks, so a report does not take it for a one-process run, and counts every rank's
    samples (the notebook's process appends it once the ranks' summaries are in)."""
    from jupyter_trainmate.runtime.records import read_records

    two_ranks["result"].raise_error()
    one, procs = read_records(two_ranks["folder"] / "runs")
    assert "procs" not in one
    assert procs["procs"] == {
        "ranks": 2, "backend": "gloo", "option": "2", "rank": 0, "samples_by_rank": [96, 96]
    }  # fmt: skip
    assert procs["summary"]["samples"] == one["summary"]["samples"] == 3 * 64


def test_what_cannot_run_data_parallel_is_refused_in_one_line() -> None:
    ip = shell(8, SETUP + "log = open('train.log', 'w')\n")
    result = ip.run_cell("%%train --procs 2 --backend gloo\nlog.write(str(model))\n" + LOOP)
    error = result.error_in_exec
    assert isinstance(error, UsageError)
    assert str(error) == (
        "%%train: --procs: cannot send 'log' to the workers: a file open for writing "
        "(TextIOWrapper)"
    )
    ip.user_ns["log"].close()
    result = ip.run_cell("%%train --procs 2 --backend gloo\nfor xb, yb in loader:\n    print(xb)\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "the cell reads no model by name" in str(result.error_in_exec)


FAILING = """
import torch.distributed as dist
step = 0
for epoch in range(1000):
    for xb, yb in loader:
        step += 1
        if step == 5 and dist.get_rank() == 1:
            raise ValueError(f"boom on rank {dist.get_rank()} at step {step}")
        train_step(xb, yb)
"""


def test_a_failing_rank_stops_the_others_and_shows_its_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from jupyter_trainmate.distributed.launch import WorkerFailed

    ip = shell(8)
    handler = signal.getsignal(signal.SIGINT)
    result = ip.run_cell("%%train --procs 2 --backend gloo --display off\n" + FAILING)
    error = result.error_in_exec
    # rank 0 would train for 1000 epochs: the launch returned because it was stopped
    assert isinstance(error, WorkerFailed)
    assert error.rank == 1
    assert str(error) == "--procs: rank 1 of 2 failed: ValueError: boom on rank 1 at step 5"
    lines = error._render_traceback_()
    assert lines[0].startswith("%%train --procs: rank 1 of 2 failed")
    text = "\n".join(lines)
    assert "raise ValueError" in text  # the cell's own line
    assert "worker.py" not in text  # from the cell's frame on
    assert signal.getsignal(signal.SIGINT) is handler  # the launcher's handlers are gone


INTERRUPTED = """
import pathlib, time
import torch.distributed as dist
step = 0
for epoch in range(1000):
    for xb, yb in loader:
        step += 1
        train_step(xb, yb)
        if step == 6 and dist.get_rank() == 0:
            pathlib.Path(MARK).touch()
        time.sleep(0.02)
"""


def test_ctrl_c_stops_the_workers_and_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    from jupyter_trainmate.runtime.checkpoint import checkpoints
    from jupyter_trainmate.runtime.checkpoint import load as load_checkpoint

    ip = shell(8)
    mark = tmp_path / "mark"
    ip.user_ns["MARK"] = str(mark)
    handler = signal.getsignal(signal.SIGINT)

    def interrupt_when_training() -> None:
        for _ in range(6000):
            if mark.exists():
                os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in the notebook sends
                return
            threading.Event().wait(0.05)

    sender = threading.Thread(target=interrupt_when_training, daemon=True)
    sender.start()
    folder = tmp_path / "ckpt"
    result = ip.run_cell(
        f"%%train --procs 2 --backend gloo --display off --checkpoint {folder}\n" + INTERRUPTED
    )
    sender.join(timeout=5)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGINT) is handler
    found = checkpoints(folder)
    assert found, "rank 0 saved a checkpoint on the interrupt"
    payload = load_checkpoint(found[-1])
    state = payload["models"]["model"]
    assert set(state) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    assert payload["steps"] >= 6
    ip.user_ns["model"].load_state_dict(state)  # the unwrapped model's keys


def test_ddp_reduces_only_at_the_end_of_an_accumulation_window() -> None:
    """In process, one rank: the wrapper's sync flag follows the window; loaders are sharded
    with the loader's shuffling and a seed, and the notebook's loader is left alone."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from jupyter_trainmate.distributed.worker import TrainmateDDP, shard
    from jupyter_trainmate.runtime.accumulation import Accumulation

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = TrainmateDDP(torch.nn.Linear(4, 1))
        window = Accumulation(3)
        model.accumulation = window
        syncs = []
        for pending in range(3):
            window.pending = pending
            model(torch.ones(2, 4)).sum().backward()
            syncs.append(model.require_backward_grad_sync)
        assert syncs == [False, False, True]
        assert model.in_features == 4  # the model's own attributes read through
    finally:
        dist.destroy_process_group()
    data = TensorDataset(torch.arange(10.0))
    loader = DataLoader(data, batch_size=2, shuffle=True, drop_last=True)
    rebuilt, why = shard(loader, rank=1, world=2, seed=7)
    assert why is None
    assert rebuilt is not loader
    sampler = rebuilt.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.rank, sampler.num_replicas, sampler.shuffle, sampler.seed) == (1, 2, True, 7)
    assert rebuilt.batch_size == 2
    assert rebuilt.drop_last
    assert len(list(rebuilt)) == 2  # 5 of the 10 samples, in whole batches of 2


@pytest.mark.gpu
def test_single_rank_nccl_run_trains_the_notebook_model() -> None:
    """One rank per GPU (a single rank on a one-GPU machine): the model, optimizer state and
    data on the notebook's GPU travel through the CPU to each rank's own GPU and back."""
    ranks = torch.cuda.device_count()
    setup = (
        SETUP.replace("torch.randn(64, 8)", "torch.randn(64, 8, device='cuda')")
        .replace("torch.randn(64, 1)", "torch.randn(64, 1, device='cuda')")
        .replace("model = MLP()", "model = MLP().cuda()")
    )
    ip = shell(8, setup)
    before = weights(ip)
    ip.run_cell("%%train --procs gpus --backend nccl --display off\n" + LOOP).raise_error()
    after = weights(ip)
    assert all(v.device.type == "cuda" for v in after.values())
    assert any(not torch.equal(after[k], before[k]) for k in after)
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    assert len(ip.user_ns["history"]) == 3
    assert any(f"x {ranks} ranks" in e for e in summary.events)


def test_the_payload_keeps_what_the_cell_reads_shared_and_the_functions_in_its_namespace() -> None:
    """No launch: the payload of a cell, loaded back as a worker loads it."""
    import cloudpickle

    from jupyter_trainmate.workers.payload import build, cell_reads, load, reached

    source = (
        "for xb, yb in loader:\n    loss = train_step(xb, yb)\nn = [i * SCALE for i in range(2)]\n"
    )
    reads = cell_reads(source)
    assert {"loader", "train_step", "range", "SCALE"} <= set(reads)
    assert "i" not in reads  # the comprehension's own
    ip = shell(8, SETUP + "SCALE = 3\nunrelated = object()\n")
    namespace = ip.user_ns
    assert {"model", "opt", "loss_fn"} <= reached(["train_step"], namespace)
    payload = cloudpickle.loads(build(source, "<cell>", namespace, "--procs").dumps())
    assert set(payload.names) == {"loader", "train_step", "SCALE"}  # `range` is a builtin
    loaded = load(payload)
    assert "unrelated" not in loaded
    assert loaded["train_step"].__globals__ is loaded  # rebinding `model` reaches the function
    model, opt = loaded["model"], loaded["opt"]  # came with train_step, still one object each
    assert opt.param_groups[0]["params"][0] is model.net[0].weight
    assert type(model).__name__ == "MLP"
    assert loaded["train_step"].__code__.co_filename == namespace["train_step"].__code__.co_filename


def test_the_notebook_display_averages_the_loss_and_sums_the_samples(tmp_path: Path) -> None:
    """No launch: the ranks' status files as the notebook process reads them."""
    import json

    from jupyter_trainmate.distributed.launch import RemoteRun
    from jupyter_trainmate.runtime.options import TrainOptions
    from jupyter_trainmate.runtime.status import STATUS_SUBDIR

    run = RemoteRun(tmp_path, 2, TrainOptions(procs="2", backend="gloo"))
    assert run.progress().steps == 0  # before the workers wrote anything
    for rank, (loss, rate) in enumerate([(1.0, 100.0), (3.0, 120.0)]):
        folder = tmp_path / f"rank-{rank}" / STATUS_SUBDIR
        folder.mkdir(parents=True)
        status = {
            "steps": 10 + rank, "samples": 80, "optimizer_steps": 10, "epoch": 1,
            "epochs_total": 2, "step_in_epoch": 10, "steps_per_epoch": 20, "fraction": 0.25,
            "eta_s": 3.0, "wall_s": 1.0, "samples_per_s": rate, "steps_per_s": 10.0,
            "data_wait_share": 0.1, "last_loss": loss, "device": "cpu", "amp": "off",
            "pid": 1, "updated": 0.0,
        }  # fmt: skip
        (folder / "1-1.json").write_text(json.dumps(status))
    progress = run.progress()
    assert progress.steps == 10  # rank 0's position
    assert progress.last_loss == 2.0
    assert progress.samples == 160
    assert progress.samples_per_s == 220.0


def test_a_one_line_error_in_the_workers_stays_one_line(tmp_path: Path) -> None:
    """The runtime's own errors (a bad option for this cell) are not shown as a traceback."""
    ip = shell(8)
    empty = tmp_path / "none"
    result = ip.run_cell(
        f"%%train --procs 2 --backend gloo --display off --checkpoint {empty} --resume\n" + LOOP
    )
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == f"%%train: --resume: no checkpoint in {empty}"


def test_the_notebook_side_leaves_the_ended_file_for_the_toast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No launch: the lab's toast and the webhook read `trainmate-ended/` and `--notify-after`;
    the workers' own status files are in the run's temporary folder, so the notebook writes it."""
    import json

    from jupyter_trainmate.distributed.launch import Watcher
    from jupyter_trainmate.runtime.options import TrainOptions
    from jupyter_trainmate.runtime.status import ENDED_SUBDIR

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    options = TrainOptions(procs="2", backend="gloo", display="off", notify_after=5.0)
    watcher = Watcher(tmp_path / "run", 2, options, {}, "%%train --procs 2")
    with watcher.running():
        pass
    summary = RunSummary(
        "finished", "cpu", "off", "", "off", 1, 4, 4, (4,), 1, 32, 1.0, 0.1, 0.9, 0.1, 0
    )
    watcher.finish(summary)
    (ended,) = (tmp_path / "runtime" / ENDED_SUBDIR).glob("*.json")
    record = json.loads(ended.read_text())
    assert record["outcome"] == "finished"
    assert record["notify_after"] == 5.0
    assert record["steps"] == 4


def test_a_failed_launch_leaves_a_failed_ended_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No launch: a rank that failed (or Ctrl-C) ends the notebook's side with an ended file, as
    a one-process run's failure does (the lab's toast), from the ranks' last status."""
    import json

    from jupyter_trainmate.distributed.launch import Watcher, WorkerFailed
    from jupyter_trainmate.runtime.options import TrainOptions
    from jupyter_trainmate.runtime.status import ENDED_SUBDIR

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    options = TrainOptions(procs="2", backend="gloo", display="off")
    watcher = Watcher(tmp_path / "run", 2, options, {}, "%%train --procs 2")
    with pytest.raises(WorkerFailed), watcher.running():
        raise WorkerFailed(1, 2, "RuntimeError: boom", "Traceback ...")
    (ended,) = (tmp_path / "runtime" / ENDED_SUBDIR).glob("*.json")
    assert json.loads(ended.read_text())["outcome"] == "failed"
