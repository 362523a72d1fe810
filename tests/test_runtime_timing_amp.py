from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from jupyter_trainmate.errors import TrainmateError
from jupyter_trainmate.runtime import timing
from jupyter_trainmate.runtime.amp import resolve_amp
from jupyter_trainmate.runtime.options import TrainOptions
from jupyter_trainmate.runtime.session import TrainSession
from jupyter_trainmate.runtime.timing import StepTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_step_timer_splits_data_wait_and_compute() -> None:
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    for _ in range(3):
        timer.before_fetch()
        clock.now += 0.25  # waiting for the batch
        timer.after_fetch(samples=8)
        clock.now += 0.75  # the step
    totals = timer.finish()
    assert totals.steps == 3
    assert totals.samples == 24
    assert totals.data_s == pytest.approx(0.75)
    assert totals.compute_s == pytest.approx(2.25)
    assert totals.data_share == pytest.approx(0.25)
    assert totals.gpu_steps == 0


def test_amp_auto_is_off_on_cpu_and_bf16_can_be_forced() -> None:
    cpu = torch.device("cpu")
    auto = resolve_amp("auto", cpu)
    assert auto.mode == "off"
    assert auto.dtype is None
    assert auto.grad_scaler() is None
    forced = resolve_amp("bf16", cpu)
    with forced.autocast():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16
    assert not forced.needs_scaler


def test_amp_fp16_can_be_forced_on_cpu_with_a_scaler() -> None:
    policy = resolve_amp("fp16", torch.device("cpu"))
    assert policy.needs_scaler
    assert isinstance(policy.grad_scaler(), torch.amp.GradScaler)


def test_amp_rejects_unknown_modes() -> None:
    with pytest.raises(TrainmateError, match="choose one of auto, bf16, fp16, off"):
        resolve_amp("fp8", torch.device("cpu"))


@pytest.mark.gpu
def test_amp_auto_on_cuda_follows_compute_capability() -> None:
    device = torch.device("cuda")
    policy = resolve_amp("auto", device)
    expected = "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    assert policy.mode == expected
    assert policy.needs_scaler is (expected == "fp16")


@pytest.mark.gpu
def test_step_timer_reads_gpu_time_lazily() -> None:
    device = torch.device("cuda")
    timer = StepTimer(device)
    x = torch.randn(2048, 2048, device=device)
    for _ in range(4):
        timer.before_fetch()
        timer.after_fetch(samples=1)
        x = x @ x / 2048
    totals = timer.finish()
    assert totals.gpu_steps == 4
    assert totals.gpu_s > 0


class CountingClock(FakeClock):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_batch_loop_reads_the_clock_a_few_times_a_second_and_keeps_the_data_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2000 steps of 1 ms (a quarter of it waiting for the batch), in two passes: the clock is
    read at about 32 points a second, not twice a step, and the totals stay what the steps were."""
    clock = CountingClock()
    monkeypatch.setattr(timing, "_clock", clock)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session = TrainSession(TrainOptions(), {"model": model, "opt": opt})

    def loader() -> Iterator[torch.Tensor]:
        for _ in range(1000):
            clock.now += 0.00025  # waiting for the batch
            yield torch.ones(4, 2)

    for _ in range(2):
        for batch in session.batches(loader()):
            session.zero_grad(opt)
            session.backward(model(batch).sum())
            session.step(opt)
            clock.now += 0.00075  # the step
        clock.now += 5.0  # between the passes (validation, say): no step's time
    totals = session.timer.finish()
    assert (totals.steps, totals.samples) == (2000, 8000)
    assert totals.data_share == pytest.approx(0.25, abs=0.01)
    assert totals.data_s + totals.compute_s == pytest.approx(2.0, rel=0.01)
    assert clock.reads < 2 * 2000 / 10  # a timed point every ~31 steps here, not two reads a step


def test_slow_steps_are_all_timed() -> None:
    clock = CountingClock()
    timer = StepTimer(clock=clock)
    strides = []
    for _ in range(5):
        strides.append(timer.before_fetch())
        clock.now += 0.5
        timer.after_fetch(samples=1)
        clock.now += 0.5
    assert strides == [1] * 5  # a step of a second: every step is a timed point
