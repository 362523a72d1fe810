"""`%%train --procs 2 --resume`: a data-parallel run that failed mid-epoch continues from rank 0's
last checkpoint in every rank and ends with the weights of the run that was never stopped; one
process cannot continue that epoch and says so in one line.

Three launches of two ranks (gloo): the uninterrupted run, the one whose rank 0 fails at step 6 of 12
(a checkpoint every 3 steps, so mid-epoch), and its resumption.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import last_run

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
x, y = torch.randn(64, 8), torch.randn(64, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loader = DataLoader(
    TensorDataset(x, y), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(5)
)
history = []
"""
# 64 samples, 2 ranks, batches of 8: 4 steps a rank per epoch, 12 in all
# Rank 0 fails (it writes its checkpoint before it leaves; rank 1's next all-reduce then fails)
CELL = """
import torch.distributed as dist
step = 0
for epoch in range(3):
    for xb, yb in loader:
        if step == STOP_AT and dist.get_rank() == 0:
            raise RuntimeError(f"stopped at step {step}")
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        step += 1
    history.append(loss.item())
"""
OPTIONS = "%%train --procs 2 --backend gloo --display off --every 3 --checkpoint "


def shell(stop_at: int | None) -> InteractiveShell:
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    ip.user_ns["STOP_AT"] = stop_at
    return ip


def weights(ip: InteractiveShell) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in ip.user_ns["model"].state_dict().items()}


def test_a_failed_data_parallel_run_resumes_mid_epoch_to_the_same_weights() -> None:
    from jupyter_trainmate.distributed.launch import WorkerFailed

    whole = shell(None)
    whole.run_cell(OPTIONS + "whole\n" + CELL).raise_error()
    reference, reference_history = weights(whole), list(whole.user_ns["history"])

    ip = shell(6)
    before = weights(ip)
    failed = ip.run_cell(OPTIONS + "stopped\n" + CELL)
    assert isinstance(failed.error_in_exec, WorkerFailed)
    assert (
        str(failed.error_in_exec) == "--procs: rank 0 of 2 failed: RuntimeError: stopped at step 6"
    )
    after_failure = weights(ip)
    assert all(torch.equal(after_failure[k], before[k]) for k in before)  # nothing came back

    shutil.copytree("stopped", "stopped-copy")  # as the failed run left it (mid-epoch)
    ip.user_ns["STOP_AT"] = None
    ip.run_cell(OPTIONS + "stopped --resume\n" + CELL).raise_error()
    summary = last_run()
    assert summary is not None
    assert summary.steps == 6  # rank 0's: the 6 steps a rank had left
    assert summary.samples == 2 * 6 * 8  # both ranks'
    for key, value in weights(ip).items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=1e-7)
    assert ip.user_ns["history"] == reference_history[1:]  # epochs 1 and 2, the resumed ones

    # one process cannot continue the 2 ranks' epoch: the position counts one rank's batches
    one = ip.run_cell("%%train --display off --checkpoint stopped-copy --resume\n" + CELL)
    assert isinstance(one.error_in_exec, UsageError)
    assert str(one.error_in_exec) == (
        "%%train: --resume: the checkpoint was written mid-epoch by a run of 2 rank(s) and its "
        "position counts one rank's batches; this run has 1 (resume with --procs 2, or from a "
        "checkpoint written at an epoch's end)"
    )


def test_a_leaving_rank_finishes_its_checkpoint_write_despite_the_launchers_sigterm() -> None:
    """No launch: the launcher's SIGTERM (another rank failed) reaches a rank whose own run is
    ending and waiting for its checkpoint writer; the write is waited for, not cut short."""
    import os
    import signal
    import threading
    from types import SimpleNamespace

    from jupyter_trainmate.distributed.worker import _interrupt, finish_checkpoints

    written: list[str] = []

    def wait() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the write is still going on
        threading.Event().wait(0.2)
        written.append("checkpoint")

    session = SimpleNamespace(checkpoints=SimpleNamespace(wait=wait))
    handler = signal.signal(signal.SIGTERM, _interrupt)  # the worker's: SIGTERM -> Ctrl-C
    try:
        finish_checkpoints([session])  # type: ignore[list-item]
    except KeyboardInterrupt:
        pytest.fail("the SIGTERM cut the checkpoint write short")
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert written == ["checkpoint"]
