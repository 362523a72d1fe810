"""What a run pays besides its steps, made cheaper without changing what it produces: the cell's
code compiled once per source, TensorBoard events written without a writer thread."""

from __future__ import annotations

import traceback
from pathlib import Path
from types import CodeType

import pytest

from jupyter_trainmate import _state
from jupyter_trainmate.rewrite import retry
from jupyter_trainmate.runtime.records import read_records

from .train_harness import COMMON, fresh_shell, run

NESTED = """
def helper(v):
    return [1 / x for x in v]
total = sum(helper([1, 2, 0]))
"""


def _raised_in(code: CodeType) -> list[str]:
    with pytest.raises(ZeroDivisionError) as caught:
        exec(code, {})
    return [frame.filename for frame in traceback.extract_tb(caught.value.__traceback__)[1:]]


def test_a_rerun_reuses_the_compiled_code_under_its_own_file_name() -> None:
    first = retry.compile_rewritten(NESTED, NESTED, "<cell 1>")
    second = retry.compile_rewritten(NESTED, NESTED, "<cell 2>")
    assert len(retry._COMPILED) == 1  # compiled once
    # Every frame (the cell, its function, the comprehension inside) names its own run's cell.
    assert _raised_in(first) == ["<cell 1>"] * 3
    assert _raised_in(second) == ["<cell 2>"] * 3
    assert retry.compile_rewritten(NESTED, NESTED, "<cell 2>").co_filename == "<cell 2>"
    _state.reset()  # with the rewrite cache (module state: tests start without it)
    assert not retry._COMPILED


def test_a_syntax_error_is_never_cached_and_names_the_cell() -> None:
    for name in ("<cell 1>", "<cell 2>"):
        with pytest.raises(SyntaxError) as caught:
            retry.compile_rewritten("x = (\n", "x = (\n", name)
        assert caught.value.filename == name
    assert not retry._COMPILED


def test_a_rerun_cell_that_fails_points_at_its_own_execution(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ip = fresh_shell()
    ip.run_line_magic("colors", "nocolor")
    ip.run_cell(COMMON, store_history=True).raise_error()  # In[1]
    cell = "%%train --display off\nfor xb, yb in loader:\n    loss = loss_fn(model(xb), yb)\n    1 / 0\n"
    for number in (2, 3):
        capsys.readouterr()
        ip.run_cell(cell, store_history=True)
        shown = capsys.readouterr().out
        assert f"Cell In[{number}], line 3" in shown  # In[3]: the reused code was renamed
        assert "----> 3     1 / 0" in shown


def test_tensorboard_events_of_a_short_run(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    loop = "for xb, yb in loader:\n    loss_fn(model(xb), yb).backward()\n    opt.step()\n"
    run([COMMON + "\nimport jupyter_trainmate\n", loop], "--display off --tensorboard on")
    (record,) = read_records(tmp_path / "runs")
    folder = Path(record["tensorboard"])
    (events_file,) = folder.iterdir()
    assert events_file.name.startswith("events.out.tfevents.")
    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    (options,) = events.Tensors("run/options/text_summary")  # the tags SummaryWriter writes
    assert options.tensor_proto.string_val == [b"%%train --display off --tensorboard on"]
    (summary,) = events.Tensors("run/summary/text_summary")
    assert summary.step == 8
    assert b"finished after 1 epoch(s), 8 steps" in summary.tensor_proto.string_val[0]
    loss = events.Scalars("train/loss")  # the last reading, written at the end
    assert loss[-1].step == 8
    assert 0 < loss[-1].value < 10


def test_the_prefetch_probe_is_not_fooled_by_one_slow_sample() -> None:
    """A sample that took long once (the machine took the core away, say) does not make
    in-memory loading look like waiting: `--prefetch auto` keeps the training thread."""
    import time

    import torch
    from torch.utils.data import DataLoader, Dataset

    from jupyter_trainmate.runtime.prefetch import auto_thread

    class OnceSlow(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> torch.Tensor:
            if i == 0:
                time.sleep(0.005)  # waits 5 ms, once
            return torch.full((4,), float(i))

    why = auto_thread(DataLoader(OnceSlow(), batch_size=32))
    assert why is not None
    assert "CPU work on this thread" in why
