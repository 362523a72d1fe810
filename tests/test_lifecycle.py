"""Checkpoints and resume: interrupt anywhere, continue, end bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import RunSummary, last_run
from jupyter_trainmate.errors import TrainmateError
from jupyter_trainmate.runtime.checkpoint import checkpoints, load

from .train_harness import COMMON, fresh_shell, run, weights

LOOP = """
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
for epoch in range(3):
    model.train()
    for xb, yb in loader:
        step_counter += 1
        if step_counter == STOP_BEFORE_FORWARD:
            raise KeyboardInterrupt
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        if step_counter == STOP_AFTER_STEP:
            raise KeyboardInterrupt
    sched.step()
"""


def reference() -> dict[str, torch.Tensor]:
    setup = COMMON + "\nstep_counter = 0\nSTOP_BEFORE_FORWARD = STOP_AFTER_STEP = -1\n"
    return weights(run([setup, LOOP], None))


def interrupt_then_resume(
    before: int, after: int, line: str, between: Callable[[], None] = lambda: None
) -> tuple[InteractiveShell, RunSummary]:
    """Run LOOP under `%%train LINE`, stopped by a KeyboardInterrupt at step `before` (ahead of
    the forward) or `after` (after the optimizer step); call `between`; run it with `--resume`."""
    ip = fresh_shell()
    ip.run_cell(
        COMMON + f"\nstep_counter = 0\nSTOP_BEFORE_FORWARD = {before}\nSTOP_AFTER_STEP = {after}\n"
    ).raise_error()
    ip.run_cell(f"%%train {line}\n{LOOP}")
    interrupted = last_run()
    assert interrupted is not None
    assert interrupted.outcome == "interrupted"
    between()
    ip.user_ns["STOP_BEFORE_FORWARD"] = ip.user_ns["STOP_AFTER_STEP"] = -1
    ip.run_cell(f"%%train {line} --resume\n{LOOP}").raise_error()
    resumed = last_run()
    assert resumed is not None
    assert resumed.outcome == "finished"
    return ip, interrupted


def assert_same_weights(expected: dict[str, torch.Tensor], ip: InteractiveShell) -> None:
    got = weights(ip)
    differing = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not differing, differing


@pytest.mark.parametrize(
    ("before", "after", "every"),
    [(11, -1, 0), (-1, 13, 0), (20, -1, 5), (-1, 8, 4)],
    ids=["mid-epoch-before-forward", "mid-epoch-after-step", "every-5", "end-of-epoch"],
)
def test_interrupt_then_resume_is_bit_identical(
    before: int, after: int, every: int, tmp_path: Path
) -> None:
    expected = reference()
    line = f"--checkpoint {tmp_path} --every {every} --display off"
    ip, interrupted = interrupt_then_resume(
        before, after, line, lambda: assert_checkpointed(tmp_path)
    )
    assert any("continue with %%train --resume" in e for e in interrupted.events)
    assert_same_weights(expected, ip)
    assert ip.user_ns["opt"].param_groups[0]["lr"] == pytest.approx(0.1 * 0.7**3)


def assert_checkpointed(folder: Path, mid_window: bool = False) -> None:
    found = checkpoints(folder)
    assert found
    if mid_window:
        assert load(found[-1])["pending"] > 0  # it stopped inside an accumulation window


@pytest.mark.parametrize(
    ("before", "after", "every"),
    [(11, -1, 0), (-1, 13, 0), (-1, 14, 3)],
    ids=["mid-window-before-forward", "mid-window-after-backward", "every-3-mid-window"],
)
def test_interrupt_then_resume_with_accumulation_is_bit_identical(
    before: int, after: int, every: int, tmp_path: Path
) -> None:
    """With --accumulate 4 an interrupt lands inside a window: the gradients summed so far travel
    in the checkpoint, and the resumed run ends exactly where the uninterrupted one does."""
    setup = COMMON + "\nstep_counter = 0\nSTOP_BEFORE_FORWARD = STOP_AFTER_STEP = -1\n"
    expected = weights(run([setup, LOOP], "--accumulate 4 --display off"))
    line = f"--accumulate 4 --checkpoint {tmp_path} --every {every} --display off"
    ip, _ = interrupt_then_resume(
        before, after, line, lambda: assert_checkpointed(tmp_path, mid_window=True)
    )
    assert_same_weights(expected, ip)


def test_checkpoints_hold_the_state_of_their_step_while_training_goes_on(tmp_path: Path) -> None:
    """Checkpoints are serialised on a thread while the next steps run: each must hold the
    weights and optimizer state of the step it was taken at, never a later one's."""
    cell = """
big = nn.Sequential(nn.Linear(8, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 2))
opt_big = torch.optim.Adam(big.parameters(), lr=1e-3)
states = []
for xb, yb in loader:
    opt_big.zero_grad()
    loss_fn(big(xb), yb).backward()
    opt_big.step()
    states.append({k: v.clone() for k, v in big.state_dict().items()})
"""
    ip = run([COMMON, cell], f"--checkpoint {tmp_path} --every 1 --keep 100 --display off")
    states = ip.user_ns["states"]
    saved = checkpoints(tmp_path)
    assert len(saved) == len(states) + 1  # one per step, and the epoch's end
    for step, path in enumerate(saved[:-1]):
        model_state = load(path)["models"]["big"]
        assert all(torch.equal(model_state[k], states[step][k]) for k in model_state), step


def test_keep_prunes_old_checkpoints(tmp_path: Path) -> None:
    setup = COMMON + "\nstep_counter = 0\nSTOP_BEFORE_FORWARD = STOP_AFTER_STEP = -1\n"
    run([setup, LOOP], f"--checkpoint {tmp_path} --every 2 --keep 2 --display off")
    kept = checkpoints(tmp_path)
    assert len(kept) == 2
    assert load(kept[-1])["position"] == 0  # the last one: the end of the last epoch
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_without_a_checkpoint_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--resume: no checkpoint in"):
        run(
            [COMMON, LOOP.replace("step_counter += 1", "pass")], f"--checkpoint {tmp_path} --resume"
        )


@pytest.mark.parametrize(
    "content",
    [b"not a checkpoint at all", b"\x80\x04\x95"],
    ids=["garbage", "truncated-pickle"],
)
def test_malformed_checkpoint_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "step-00000001.pt"
    path.write_bytes(content)
    with pytest.raises(TrainmateError) as exc:
        load(path)
    assert "not a jupyter_trainmate checkpoint" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_foreign_pickle_runs_no_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "step-00000001.pt"
    code = (
        "import os, pickle, torch\n"
        "class Evil:\n"
        f"    def __reduce__(self): return (os.system, ('touch {marker}',))\n"
        f"torch.save({{'format': 'jupyter_trainmate.checkpoint', 'x': Evil()}}, {str(evil)!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(TrainmateError, match="not a jupyter_trainmate checkpoint"):
        load(evil)
    assert not marker.exists()


def test_sigkill_while_writing_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    writer = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from jupyter_trainmate.runtime.checkpoint import save_atomically\n"
        "d = Path(sys.argv[1])\n"
        "save_atomically({'format': 'jupyter_trainmate.checkpoint', 'version': 1, 'w': torch.ones(3)}, d / 'step-00000001.pt')\n"
        "print('first', flush=True)\n"
        "big = {'format': 'jupyter_trainmate.checkpoint', 'version': 1, 'w': torch.zeros(400_000_000, dtype=torch.uint8)}\n"
        "while True:\n"
        "    save_atomically(big, d / 'step-00000001.pt')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"first"
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".step-00000001.pt.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.005)  # wait until the big write is under way
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    payload = load(tmp_path / "step-00000001.pt")
    assert payload["w"].numel() in (3, 400_000_000)  # the old file or the new one, never half


NAN_LOOP = """
for epoch in range(2):
    for xb, yb in loader:
        step_counter += 1
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        if step_counter == 5:
            loss = loss * float("nan")
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("policy", ["skip", "rollback"])
def test_nan_is_skipped_or_rolled_back_and_weights_stay_finite(policy: str) -> None:
    ip = run([COMMON + "\nstep_counter = 0\n", NAN_LOOP], f"--on-nan {policy} --display off")
    assert all(torch.isfinite(t).all() for t in weights(ip).values())
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    (event,) = [e for e in summary.events if "non-finite loss at step 5" in e]
    assert ("rolled back" in event) is (policy == "rollback")
    assert summary.optimizer_steps == 15  # one update dropped


def test_nan_without_a_guard_poisons_the_weights() -> None:
    ip = run([COMMON + "\nstep_counter = 0\n", NAN_LOOP], "--display off")
    assert not all(torch.isfinite(t).all() for t in weights(ip).values())


def test_nan_stop_names_the_step_even_when_noticed_late() -> None:
    with pytest.raises(UsageError, match="--on-nan stop: non-finite loss at step 5"):
        run([COMMON + "\nstep_counter = 0\n", NAN_LOOP], "--on-nan stop --display off")
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "failed"


def test_early_stopping_stops_at_the_expected_epoch() -> None:
    loop = """
import jupyter_trainmate
scripted = [0.9, 0.7, 0.6, 0.65, 0.62, 0.61, 0.5, 0.4]
epochs_run = 0
for epoch in range(8):
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    epochs_run += 1
    jupyter_trainmate.log(val_loss=scripted[epoch])
"""
    ip = run([COMMON, loop], "--patience 3 --monitor val_loss --mode min --display off")
    assert ip.user_ns["epochs_run"] == 6  # best 0.6 at epoch 3; 3 reports without improvement
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "stopped early"
    assert any("val_loss=0.61: no improvement on 0.6 in 3 report(s)" in e for e in summary.events)


SPIKE_LOOP = """
for epoch in range(2):
    for xb, yb in loader:
        step_counter += 1
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        if step_counter == 13:
            loss = loss * 1000.0
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize("policy", ["warn", "skip", "rollback"])
def test_gradient_spike_is_noticed_under_each_policy(policy: str) -> None:
    ip = run([COMMON + "\nstep_counter = 0\n", SPIKE_LOOP], f"--on-spike {policy} --display off")
    summary = last_run()
    assert summary is not None
    spikes = [e for e in summary.events if "gradient norm" in e]
    # warn lets the huge update through, so later steps may spike too; the first is step 13
    assert len(spikes) == 1 or policy == "warn"
    event = spikes[0]
    assert "at step 13 is" in event
    assert "x the running median" in event
    assert summary.optimizer_steps == (16 if policy == "warn" else 15)
    assert ("rolled back" in event) is (policy == "rollback")
    assert all(torch.isfinite(t).all() for t in weights(ip).values())


def test_no_spike_no_event_and_same_weights() -> None:
    loop = SPIKE_LOOP.replace("loss * 1000.0", "loss")
    plain = weights(run([COMMON + "\nstep_counter = 0\n", loop], None))
    ip = run([COMMON + "\nstep_counter = 0\n", loop], "--on-spike skip --display off")
    summary = last_run()
    assert summary is not None
    assert not [e for e in summary.events if "gradient norm" in e]
    assert all(torch.equal(v, weights(ip)[k]) for k, v in plain.items())


def test_resume_with_a_changed_learning_rate(tmp_path: Path) -> None:
    loop = LOOP.replace(
        "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)\n", ""
    )
    loop = loop.replace("    sched.step()\n", "")
    ip = fresh_shell()
    ip.run_cell(
        COMMON + "\nstep_counter = 0\nSTOP_BEFORE_FORWARD = 11\nSTOP_AFTER_STEP = -1\n"
    ).raise_error()
    ip.run_cell(f"%%train --checkpoint {tmp_path} --display off\n{loop}")
    ip.user_ns["STOP_BEFORE_FORWARD"] = -1
    ip.run_cell(
        f"%%train --checkpoint {tmp_path} --display off --resume --set lr=0.003 --set momentum=0.5\n{loop}"
    ).raise_error()
    group = ip.user_ns["opt"].param_groups[0]
    assert (group["lr"], group["momentum"]) == (0.003, 0.5)
    summary = last_run()
    assert summary is not None
    assert any("--set lr=0.003 on 1 parameter group(s)" in e for e in summary.events)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--checkpoint X --resume --set lr", "write NAME=VALUE"),
        ("--checkpoint X --resume --set lr=fast", "'fast' is not a number"),
        ("--checkpoint X --set lr=0.1", "add --resume"),
    ],
)
def test_bad_set_is_a_usage_error(line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run([COMMON, LOOP], line)


OOM_HOOK = """
failures = []
def refuse_big_batches(module, inputs):
    if inputs[0].shape[0] > LIMIT:
        failures.append(inputs[0].shape[0])
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
model[0].register_forward_pre_hook(refuse_big_batches)
"""
OOM_LOOP = """
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
"""


def test_out_of_memory_is_retried_as_micro_batches_equal_to_accumulation() -> None:
    """The first step fails with out-of-memory (batches over 16 refused): it and every later
    step run as 2 micro-batches of 16, which must equal `--accumulate 2` on batches of 16."""
    small = COMMON.replace("batch_size=32", "batch_size=16")
    assert small != COMMON
    expected = weights(run([small, OOM_LOOP], "--accumulate 2 --display off"))
    ip = run([COMMON + "\nLIMIT = 16\n" + OOM_HOOK, OOM_LOOP], "--oom-retry on --display off")
    assert ip.user_ns["failures"] == [32]  # one failed attempt: the split is kept afterwards
    got = weights(ip)
    differing = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not differing, differing
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    assert summary.optimizer_steps == 16
    assert ip.user_ns["opt"].param_groups[0]["lr"] == pytest.approx(0.1 / 17)
    (event,) = [e for e in summary.events if "out of memory" in e]
    assert "the batch of 32 now runs as 2 micro-batches of 16" in event


def test_out_of_memory_frees_the_failed_attempt_before_the_retry() -> None:
    hook = """
import weakref
held = []
alive_at_retry = []
def fail_once_after_activations(module, inputs, output):
    if not held:
        held.append(weakref.ref(inputs[0]))  # an activation of the failed attempt
        raise torch.OutOfMemoryError("CUDA out of memory")
    if len(alive_at_retry) == 0:
        alive_at_retry.append(held[0]() is not None)
model[3].register_forward_hook(fail_once_after_activations)
"""
    ip = run([COMMON + hook, OOM_LOOP], "--oom-retry on --display off")
    assert ip.user_ns["alive_at_retry"] == [False]
    assert "loss" in ip.user_ns  # assigned again by the retry


def test_out_of_memory_at_one_sample_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="out of memory at step 1 even with micro-batches of 1"):
        run([COMMON + "\nLIMIT = 0\n" + OOM_HOOK, OOM_LOOP], "--oom-retry on --display off")
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "failed"
    assert any("runs as 32 micro-batches of 1" in e for e in summary.events)


def test_out_of_memory_inside_an_accumulation_window_is_not_retried() -> None:
    hook = """
calls = []
def fail_on_the_second_batch(module, inputs):
    calls.append(1)
    if len(calls) == 2:
        raise torch.OutOfMemoryError("CUDA out of memory")
model[0].register_forward_pre_hook(fail_on_the_second_batch)
"""
    ip = fresh_shell()
    ip.run_cell(COMMON + hook).raise_error()
    result = ip.run_cell(f"%%train --accumulate 2 --oom-retry on --display off\n{OOM_LOOP}")
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "failed"
    assert any("inside an --accumulate window" in e for e in summary.events)
