"""Issue 14: no out-of-memory retry point per step where no such error can happen (the CPU),
`--oom-retry {auto,on,off}` to choose, and a rewrite cache that never mixes the two."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from jupyter_trainmate import last_run
from jupyter_trainmate.rewrite import MARK, rewrite_cell
from jupyter_trainmate.runtime import oom
from jupyter_trainmate.runtime.options import parse_options

from .train_harness import (
    COMMON,
    REFUSE_BIG_BATCHES,
    assert_parity,
    assert_retried_as_micro_batches,
    fresh_shell,
    run,
)

LOOP = """
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
"""


@pytest.fixture
def detection() -> Iterator[None]:
    """`oom_possible` is decided once per process: each test that fakes the hardware starts
    and ends with it undecided."""
    oom.oom_possible.cache_clear()
    yield
    oom.oom_possible.cache_clear()


def shown(capsys: pytest.CaptureFixture[str], line: str) -> str:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    capsys.readouterr()
    ip.run_cell(f"%%train --show {line}\n{LOOP}").raise_error()
    return capsys.readouterr().out


def test_the_option_defaults_to_auto_and_takes_three_values() -> None:
    assert parse_options("").oom_retry == "auto"
    assert parse_options("--oom-retry on").oom_retry == "on"
    assert parse_options("--oom-retry off").oom_retry == "off"


@pytest.mark.usefixtures("detection")
@pytest.mark.parametrize("accelerator", ["cuda", "mps", "xpu", None])
def test_an_out_of_memory_error_is_possible_only_with_an_accelerator(
    monkeypatch: pytest.MonkeyPatch, accelerator: str | None
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: accelerator == "cuda")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: accelerator == "mps")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: accelerator == "xpu")
    assert oom.oom_possible() is (accelerator is not None)
    assert oom.wants_retry("auto") is (accelerator is not None)
    assert oom.wants_retry("on") is True
    assert oom.wants_retry("off") is False


def test_auto_on_this_cpu_only_machine_shows_no_retry_point_and_trains_identically(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if oom.oom_possible():
        pytest.fail("this test expects a machine without an accelerator")
    out = shown(capsys, "")
    assert "__trainmate__.batches(loader)" in out  # the loop is rewritten
    assert MARK not in out
    assert "oom_guard" not in out
    assert "__trainmate__.parts(" not in out
    assert_parity([COMMON, LOOP], "--display off")


def test_on_keeps_the_retry_point_and_retries_an_injected_out_of_memory_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = shown(capsys, "--oom-retry on")
    assert out.count(MARK) == 4
    assert "__trainmate__.parts(" in out
    ip = run([COMMON + REFUSE_BIG_BATCHES, LOOP], "--oom-retry on --display off")
    assert_retried_as_micro_batches(ip)


def test_without_the_retry_point_an_out_of_memory_error_ends_the_run() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON + REFUSE_BIG_BATCHES).raise_error()
    result = ip.run_cell(f"%%train --oom-retry off --display off\n{LOOP}")
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    assert ip.user_ns["failures"] == [32]
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "failed"


def test_off_has_no_retry_point_even_with_an_accelerator(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oom, "oom_possible", lambda: True)
    assert shown(capsys, "").count(MARK) == 4  # auto, with an accelerator: retried
    out = shown(capsys, "--oom-retry off")
    assert "__trainmate__.batches(loader)" in out
    assert MARK not in out


def test_the_cache_never_hands_a_rewrite_without_retry_points_to_a_run_that_wants_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = {"loader": [], "model": torch.nn.Linear(1, 1)}
    without = rewrite_cell(LOOP, namespace, retry=False)
    assert MARK not in without.code
    with_retry = rewrite_cell(LOOP, namespace, retry=True)
    assert MARK in with_retry.code
    assert rewrite_cell(LOOP, namespace, retry=False) is without  # both stay cached
    assert rewrite_cell(LOOP, namespace, retry=True) is with_retry
    # Through the magic, in one shell: the same cell run without, then asking for the retry.
    ip = fresh_shell()
    ip.run_cell(COMMON + REFUSE_BIG_BATCHES.replace("> 16", "> LIMIT") + "LIMIT = 999\n")
    ip.run_cell(f"%%train --oom-retry off --display off\n{LOOP}").raise_error()
    ip.run_cell("LIMIT = 16").raise_error()
    ip.run_cell(f"%%train --oom-retry on --display off\n{LOOP}").raise_error()
    assert ip.user_ns["failures"] == [32]
