"""`%%train` options, errors and clean-up: what a user sees around the loop."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from torch.optim.optimizer import _global_optimizer_post_hooks

from jupyter_trainmate import last_run
from jupyter_trainmate.runtime.prefetch import auto_thread

from .train_harness import COMMON, assert_parity, fresh_shell, run, weights

LOOP = """
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
"""


def test_show_prints_the_rewritten_code_and_does_not_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    before = weights(ip)
    ip.run_cell(f"%%train --show\n{LOOP}").raise_error()
    out = capsys.readouterr().out
    assert "for xb, yb in __trainmate__.batches(loader):" in out
    assert "__trainmate__.backward(loss)" in out
    assert "instrumented cell line 3: batch loop over loader" in out
    assert "sched" not in ip.user_ns  # nothing ran
    after = weights(ip)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_rewrite_keeps_line_numbers_so_tracebacks_point_at_the_users_line() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    result = ip.run_cell(
        "%%train\nfor xb, yb in loader:\n    loss = loss_fn(model(xb), yb)\n    loss.backward()\n    1 / 0\n"
    )
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    frames = []
    tb = result.error_in_exec.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    assert frames[-1][1] == 4  # line 4 of the cell body: `1 / 0`
    # and its columns, though the body runs indented inside the out-of-memory retry point
    where = traceback.extract_tb(result.error_in_exec.__traceback__)[-1]
    assert (where.colno, where.end_colno) == (4, 9)
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "failed"


def test_nothing_is_left_patched_after_a_failing_cell() -> None:
    hooks_before = len(_global_optimizer_post_hooks)
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell("def helper(m, xb, yb):\n    loss_fn(m(xb), yb).backward()\n").raise_error()
    original = ip.user_ns["helper"]
    result = ip.run_cell(
        "%%train --amp bf16\nfor xb, yb in loader:\n    helper(model, xb, yb)\n    raise RuntimeError('boom')\n"
    )
    assert isinstance(result.error_in_exec, RuntimeError)
    assert "__trainmate__" not in ip.user_ns
    assert ip.user_ns["helper"] is original
    assert len(_global_optimizer_post_hooks) == hooks_before
    assert not torch.is_autocast_enabled("cpu")


def test_keyboard_interrupt_marks_the_run_interrupted() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(
        "%%train\nfor xb, yb in loader:\n    loss_fn(model(xb), yb).backward()\n    raise KeyboardInterrupt\n"
    )
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "interrupted"
    assert summary.steps == 1


def test_syntax_error_reads_like_ipythons_own(capsys: pytest.CaptureFixture[str]) -> None:
    ip = fresh_shell()
    result = ip.run_cell("%%train\nx = 1\nfor i in range(3)\n    pass\n")
    assert not result.success
    out = capsys.readouterr()
    text = out.out + out.err
    assert "SyntaxError" in text
    assert "line 2" in text
    assert "magic.py" not in text  # no frames of ours


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--amp fp9", "--amp fp9: choose one of"),
        ("--accumulate 0", "--accumulate 0: must be 1 or more"),
        ("--clip -1", "--clip -1.0: must be a positive max norm"),
        ("--prefetch warp", "--prefetch warp: choose one of"),
        ("--device tpu:x", "--device tpu:x: not a device"),
        ("--prefetch cuda", "--prefetch cuda: the run is on cpu"),
        ("--device cuda:0", "--device cuda:0: the model's parameters are on cpu"),
        ("--bogus", "unrecognized arguments: --bogus"),
    ],
)
def test_bad_options_are_usage_errors(line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        run([COMMON, LOOP], line)


def test_accumulate_matches_hand_written_accumulation() -> None:
    hand = """
for i, (xb, yb) in enumerate(loader):
    loss = loss_fn(model(xb), yb) / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
"""
    plain_loop = """
for xb, yb in loader:
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
"""
    expected = weights(run([COMMON, hand], None))
    got = weights(run([COMMON, plain_loop], "--accumulate 4"))
    assert all(torch.allclose(expected[k], got[k], rtol=0, atol=1e-7) for k in expected)
    summary = last_run()
    assert summary is not None
    assert summary.steps == 8
    assert summary.optimizer_steps == 2
    assert summary.accumulate == 4


def test_accumulate_steps_on_the_last_partial_window_and_schedules_real_steps() -> None:
    ip = run([COMMON, LOOP], "--accumulate 3")  # 8 batches an epoch: steps after 3, 6 and 8
    summary = last_run()
    assert summary is not None
    assert summary.optimizer_steps == 2 * 3
    # LambdaLR stepped once per real optimizer step: lr = 0.1 / (1 + 6)
    assert ip.user_ns["opt"].param_groups[0]["lr"] == pytest.approx(0.1 / 7)


def test_clip_limits_the_gradient_norm() -> None:
    cell = """
norms = []
for xb, yb in loader:
    opt.zero_grad()
    (loss_fn(model(xb), yb) * 1000).backward()
    opt.step()
    norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item())
"""
    ip = run([COMMON, cell], "--clip 0.25")
    assert max(ip.user_ns["norms"]) <= 0.25 + 1e-5


def test_fp16_scaler_skips_inf_steps_and_holds_the_scheduler_back() -> None:
    cell = """
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
for i, (xb, yb) in enumerate(loader):
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    if i in (2, 5):
        loss = loss * float("inf")
    loss.backward()
    opt.step()
    sched.step()
"""
    ip = run([COMMON, cell], "--amp fp16")
    summary = last_run()
    assert summary is not None
    assert summary.amp == "fp16"
    assert summary.skipped_steps == 2
    assert summary.optimizer_steps == 6
    assert ip.user_ns["opt"].param_groups[0]["lr"] == pytest.approx(0.1 / 7)
    assert all(torch.isfinite(t).all() for t in weights(ip).values())


def test_a_cell_with_its_own_grad_scaler_gets_no_amp_added() -> None:
    cell = """
scaler = torch.amp.GradScaler("cpu")
for xb, yb in loader:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""
    expected = weights(run([COMMON, cell], None))
    got = weights(run([COMMON, cell], "--amp fp16"))
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    summary = last_run()
    assert summary is not None
    assert summary.amp == "off"
    assert "own autocast/GradScaler" in summary.amp_reason


AMP_LOOP = """
for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
"""
# The recipe of the PyTorch AMP guide: autocast around the forward of each step, a GradScaler for
# fp16. `%%train --amp MODE` on AMP_LOOP must train exactly as this does.
AMP_RECIPE = """
scaler = torch.amp.GradScaler("cpu", enabled=USE_SCALER)
for epoch in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=DTYPE):
            loss = loss_fn(model(xb), yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
"""


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_amp_trains_exactly_as_the_per_step_autocast_recipe(mode: str) -> None:
    """Autocast held over the whole cell must not reuse weights cast before an optimizer step
    (autocast's weight-cast cache lives until the outermost autocast region exits)."""
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[mode]
    recipe = f"DTYPE = {dtype}\nUSE_SCALER = {mode == 'fp16'}\n" + AMP_RECIPE
    expected = weights(run([COMMON, recipe], None))
    ip = run([COMMON, AMP_LOOP], f"--amp {mode}")
    got = weights(ip)
    differing = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not differing, differing
    summary = last_run()
    assert summary is not None
    assert summary.amp == mode


def test_bf16_autocast_reaches_code_the_rewrite_cannot_see() -> None:
    cell = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.dtypes = []
    def forward(self, x):
        out = self.fc(x)
        self.dtypes.append(out.dtype)
        return out

net = Net()
opt2 = torch.optim.SGD(net.parameters(), lr=0.1)
for xb, yb in loader:
    opt2.zero_grad()
    loss_fn(net(xb).float(), yb).backward()
    opt2.step()
"""
    ip = run([COMMON, cell], "--amp bf16")
    assert set(ip.user_ns["net"].dtypes) == {torch.bfloat16}


def test_thread_prefetch_is_opt_in_and_keeps_batches_without_random_draws() -> None:
    cell = """
seen = []
plain_loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False)
for xb, yb in plain_loader:
    seen.append(yb)
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
"""
    expected = run([COMMON.replace("nn.Dropout(0.2), ", ""), cell], None)
    got = run([COMMON.replace("nn.Dropout(0.2), ", ""), cell], "--prefetch thread")
    assert all(
        torch.equal(a, b)
        for a, b in zip(expected.user_ns["seen"], got.user_ns["seen"], strict=True)
    )
    assert all(torch.equal(v, weights(got)[k]) for k, v in weights(expected).items())
    summary = last_run()
    assert summary is not None
    assert summary.prefetch == "thread"


def test_last_run_summary_fields() -> None:
    run([COMMON, LOOP], "")
    summary = last_run()
    assert summary is not None
    assert (summary.steps, summary.optimizer_steps, summary.epochs, summary.samples) == (
        16,
        16,
        2,
        512,
    )
    assert summary.wall_s > 0
    assert summary.samples_per_s > 0
    assert summary.data_wait_s + summary.compute_s <= summary.wall_s
    assert summary.device == "cpu"
    assert summary.amp == "off"
    assert summary.skipped_steps == 0
    assert any("loss.backward()" in n for n in summary.instrumented)
    assert "16 steps (16 optimizer steps)" in summary.line()


def test_accumulate_with_two_optimizers_is_refused() -> None:
    cell = """
opt2 = torch.optim.SGD(model.parameters(), lr=0.01)
for xb, yb in loader:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
    opt2.step()
"""
    with pytest.raises(UsageError, match="--accumulate works with one optimizer"):
        run([COMMON, cell], "--accumulate 2")


def test_traceback_from_a_batch_loop_in_a_notebook_function_names_its_cell_line() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(
        "x0 = 1\n\ndef fit():\n    for xb, yb in loader:\n"
        "        loss_fn(model(xb), yb).backward()\n        return 1 / 0\n"
    ).raise_error()
    filename = ip.user_ns["fit"].__code__.co_filename
    result = ip.run_cell("%%train\nfit()\n")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    where = traceback.extract_tb(result.error_in_exec.__traceback__)[-1]
    assert (where.filename, where.lineno, where.colno) == (filename, 6, 15)
    assert where.line == "return 1 / 0"


def test_traceback_through_a_rewritten_function_names_its_cell_line() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(
        "x0 = 1\n\ndef step(xb, yb):\n    loss_fn(model(xb), yb).backward()\n    return 1 / 0\n"
    ).raise_error()
    filename = ip.user_ns["step"].__code__.co_filename
    result = ip.run_cell("%%train\nfor xb, yb in loader:\n    step(xb, yb)\n")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    tb = result.error_in_exec.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    assert tb is not None
    assert (tb.tb_frame.f_code.co_filename, tb.tb_lineno) == (filename, 5)
    summary = last_run()
    assert summary is not None
    assert any(
        "function step line 4: loss_fn(model(xb), yb).backward()" in n for n in summary.instrumented
    )


def test_progress_and_status_file_while_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("JPY_SESSION_NAME", "/work/notebooks/train.ipynb")
    cell = """
import json, os, pathlib, time
for epoch in range(2):
    for i, (xb, yb) in enumerate(loader):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
        if epoch == 1 and i == 3:
            progress = __trainmate__.progress()
            time.sleep(1.6)  # the display thread rewrites the file about once a second
            runs = pathlib.Path(os.environ["JUPYTER_RUNTIME_DIR"]) / "trainmate-runs"
            status = [json.loads(p.read_text()) for p in runs.glob("*.json")]
"""
    ip = run([COMMON, cell], "--display off")
    progress = ip.user_ns["progress"]
    assert (progress.epoch, progress.epochs_total) == (2, 2)
    assert (progress.step_in_epoch, progress.steps_per_epoch, progress.steps) == (4, 8, 12)
    assert progress.fraction == pytest.approx(12 / 16)
    assert progress.eta_s is not None
    assert progress.eta_s > 0
    assert progress.last_loss is not None
    (status,) = ip.user_ns["status"]
    assert status["pid"] == os.getpid()
    assert status["notebook"] == "/work/notebooks/train.ipynb"
    assert status["run_name"] == "loader"
    assert (status["steps"], status["epochs_total"]) == (12, 2)  # rewritten during the run
    assert status["updated"] > status["started"] + 0.5
    assert not list((tmp_path / "trainmate-runs").glob("*"))  # removed when the run ended


TUNE_SETUP = """
import time
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        time.sleep(0.002)
        return x[i % len(x)], torch.tensor(i)
slow_loader = DataLoader(Slow(), batch_size=8, shuffle=True)
"""
TUNE_LOOP = """
order = []
for epoch in range(2):
    for xb, ids in slow_loader:
        order.extend(ids.tolist())
        opt.zero_grad()
        loss_fn(model(xb), (ids % 2)).backward()
        opt.step()
"""


def test_tune_loader_keeps_the_data_and_its_order_and_reports_each_setting() -> None:
    plain = run([COMMON, TUNE_SETUP, TUNE_LOOP], None)
    tuned = run([COMMON, TUNE_SETUP, TUNE_LOOP], "--tune-loader 2")
    assert tuned.user_ns["order"] == plain.user_ns["order"]  # same samples, same order, 2 epochs
    assert all(torch.equal(v, weights(tuned)[k]) for k, v in weights(plain).items())
    summary = last_run()
    assert summary is not None
    (report,) = [e for e in summary.events if e.startswith("--tune-loader: num_workers=0")]
    assert report.count("ms/batch") >= 2  # the current setting and at least one other
    assert "<- used" in report
    assert summary.steps == 2 * 12


CLIPPED = """
norms = []
for xb, yb in loader:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    norms.append(float(torch.nn.utils.clip_grad_norm(model.parameters(), 1.0)))
    opt.step()
"""


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.clip_grad_norm` is now deprecated")
def test_fp16_old_clip_name_returns_the_unscaled_norm_from_the_first_step() -> None:
    plain = run([COMMON, CLIPPED], None).user_ns["norms"]
    ip = run([COMMON, CLIPPED], "--amp fp16")  # a CPU GradScaler: the same path as on a GPU
    summary = last_run()
    assert summary is not None
    assert summary.amp == "fp16"
    # GradScaler-scaled gradients would give norms ~65,536 times larger (and clip them wrongly)
    assert ip.user_ns["norms"] == pytest.approx(plain, rel=2e-2)


def test_fp16_is_refused_where_the_cell_reads_gradients_it_cannot_unscale() -> None:
    cell = """
for xb, yb in loader:
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    for p in model.parameters():
        p.grad.data.clamp_(-0.01, 0.01)
    opt.step()
"""
    with pytest.raises(UsageError, match=r"--amp fp16: p\.grad\.data \(line 5\) reads gradients"):
        run([COMMON, cell], "--amp fp16")
    run([COMMON, cell], "--amp bf16")  # no scaler: fine


def test_traceback_names_the_cell_as_ipython_does_and_starts_at_the_users_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ip = fresh_shell()
    ip.run_line_magic("colors", "nocolor")
    ip.run_cell(COMMON, store_history=True).raise_error()  # In[1]
    ip.run_cell(  # In[2]
        "def fit():\n    for xb, yb in loader:\n        loss_fn(model(xb), yb).backward()\n"
        "        1 / 0\n",
        store_history=True,
    ).raise_error()
    capsys.readouterr()
    result = ip.run_cell("%%train\nx = 1\nfit()\n", store_history=True)  # In[3]
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    text = capsys.readouterr().out
    assert "Cell In[3], line 2" in text
    assert "----> 2 fit()" in text
    assert "Cell In[2], line 4, in fit()" in text
    assert "Cell In[4]" not in text
    assert "run_cell_magic" not in text  # no frame showing the whole cell as a string
    assert "skipping hidden" not in text
    assert "ZeroDivisionError: division by zero" in text


def _fit_outside_a_notebook(
    model: torch.nn.Module, opt: torch.optim.Optimizer, loader: list[torch.Tensor]
) -> int:
    for xb in loader:
        opt.zero_grad()
        model(xb).sum().backward()
        opt.step()
    return len(loader)


def test_train_rewrites_a_module_function_without_marking_it() -> None:
    from jupyter_trainmate import train

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [torch.randn(4, 3) for _ in range(5)]
    before = dict(vars(_fit_outside_a_notebook))
    assert train(_fit_outside_a_notebook, "--display off", model=model, opt=opt, loader=loader) == 5
    summary = last_run()
    assert summary is not None
    assert summary.steps == 5
    assert "batch loop over loader" in "\n".join(summary.instrumented)
    assert dict(vars(_fit_outside_a_notebook)) == before  # nothing written on the user's function
    assert "__trainmate__" not in globals()


def test_traceback_through_a_rewritten_method_names_its_cell_line() -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON).raise_error()
    ip.run_cell(
        "class Trainer:\n    def fit(self):\n        for xb, yb in loader:\n"
        "            loss_fn(model(xb), yb).backward()\n            return 1 / 0\n"
        "trainer = Trainer()\n"
    ).raise_error()
    filename = ip.user_ns["Trainer"].fit.__code__.co_filename
    result = ip.run_cell("%%train\ntrainer.fit()\n")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    where = traceback.extract_tb(result.error_in_exec.__traceback__)[-1]
    assert (where.filename, where.lineno, where.colno, where.name) == (filename, 5, 19, "fit")
    assert where.line == "return 1 / 0"
    summary = last_run()
    assert summary is not None
    assert summary.steps == 1


WAITING = """
import time
class Files(torch.utils.data.Dataset):
    def __len__(self):
        return len(x)
    def __getitem__(self, i):
        time.sleep(0.0002)  # waits, as reading a file would
        return x[i], y[i]
loader = DataLoader(Files(), batch_size=32, shuffle=True)
"""
AUGMENTING = WAITING.replace("return x[i], y[i]", "return x[i] + 0.01 * torch.randn(8), y[i]")


def test_prefetch_auto_loads_on_a_thread_when_loading_waits_and_draws_nothing() -> None:
    """Shuffle on, dropout in the model: the sampler's draw and the model's stay in order."""
    summary, _ = assert_parity([COMMON + WAITING, LOOP])
    assert summary.prefetch == "thread"
    assert any("--prefetch auto: loading on a thread" in e for e in summary.events)


def test_prefetch_auto_keeps_a_loader_that_draws_on_the_training_thread() -> None:
    assert AUGMENTING != WAITING
    summary, ip = assert_parity([COMMON + AUGMENTING, LOOP])
    assert summary.prefetch == "off"
    note = auto_thread(ip.user_ns["loader"])
    assert note is not None
    assert "draws random numbers (torch" in note


def test_prefetch_auto_keeps_in_memory_loading_on_the_training_thread() -> None:
    summary, _ = assert_parity([COMMON, LOOP])
    assert summary.prefetch == "off"
