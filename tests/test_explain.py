"""Explained errors: each kind from a real failing `%%train` cell on the CPU (CUDA-only ones
through their real exception types and messages), `trainmate explain` on saved tracebacks, the
labelled set of real messages, and `--retries`."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_trainmate import last_run
from jupyter_trainmate.cli import main
from jupyter_trainmate.errors import NanDetected
from jupyter_trainmate.explain import KINDS, Explanation
from jupyter_trainmate.explain.build import explain_message, restartable
from jupyter_trainmate.explain.classify import classify
from jupyter_trainmate.runtime.records import read_records

from .train_harness import fresh_shell

DATA = Path(__file__).parent / "data"

SETUP = """
import errno, os, signal
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
torch.manual_seed(0)
x = torch.randn(64, 8)
y = torch.randint(0, 2, (64,))
loader = DataLoader(TensorDataset(x, y), batch_size=16)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""

STEP = """
for xb, yb in loader:
    opt.zero_grad()
    loss = {loss}
    loss.backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    ip = fresh_shell()
    ip.run_cell(SETUP).raise_error()
    return ip


def fails(ip: InteractiveShell, cell: str, line: str = "") -> Explanation:
    """Run `cell` under `%%train LINE`; it must fail, and the run's summary must explain it."""
    result = ip.run_cell(f"%%train --display text --tensorboard off {line}\n{cell}")
    assert result.error_in_exec is not None, "the cell did not fail"
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "failed"
    assert summary.error is not None
    return summary.error


def test_shape_mismatch_in_a_linear_names_the_layer_and_the_shapes(shell: InteractiveShell) -> None:
    shell.run_cell("wide = DataLoader(TensorDataset(torch.randn(32, 20), y[:32]), batch_size=16)")
    cell = STEP.replace("loader", "wide").format(loss="nn.functional.cross_entropy(model(xb), yb)")
    error = fails(shell, cell)
    assert error.kind == "shape_mismatch"
    assert "model.0 = Linear(in_features=8, out_features=16" in error.cause
    assert "input (16, 20) float32 on cpu" in error.cause
    assert "batch size 16" in error.cause
    assert error.advice[0].startswith("model.0 expects 8 features and gets 20")
    assert "nn.Linear(20, ...)" in error.advice[0]


def test_float_targets_for_cross_entropy_are_a_dtype_mismatch(shell: InteractiveShell) -> None:
    error = fails(shell, STEP.format(loss="nn.functional.cross_entropy(model(xb), yb.float())"))
    assert error.kind == "dtype_mismatch"
    assert "target (16) float32 on cpu" in error.cause
    assert any("target.long()" in a for a in error.advice)


def test_target_out_of_range_in_cross_entropy(shell: InteractiveShell) -> None:
    error = fails(shell, STEP.format(loss="nn.functional.cross_entropy(model(xb), yb + 3)"))
    assert error.kind == "index_out_of_range"
    assert "the output has 2 classes" in error.cause
    assert "values 3..4" in error.cause
    assert "class indices in [0, 2)" in error.advice[0]


def test_index_out_of_range_in_an_embedding(shell: InteractiveShell) -> None:
    cell = """
emb = nn.Embedding(10, 4)
tokens = torch.arange(12).view(3, 4)
for xb, yb in loader:
    loss = emb(tokens).sum()
    loss.backward()
"""
    error = fails(shell, cell)
    assert error.kind == "index_out_of_range"
    assert "emb = Embedding(10, 4) has 10 rows" in error.cause
    assert "input (3, 4) int64 on cpu, values 0..11" in error.cause
    assert "make num_embeddings at least 12" in error.advice[0]


def test_backward_twice_names_the_tensor_that_carries_the_graph(shell: InteractiveShell) -> None:
    cell = """
h = torch.zeros(16, 2)
for xb, yb in loader:
    opt.zero_grad()
    out = model(xb) + h
    h = out
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
"""
    error = fails(shell, cell)
    assert error.kind == "backward_twice"
    assert "h (16, 2) (AddBackward0)" in error.cause
    assert ".detach()" in error.advice[0]


def test_inplace_change_of_a_saved_tensor(shell: InteractiveShell) -> None:
    cell = STEP.format(loss="model(xb).sigmoid().mul_(2).sum()")
    error = fails(shell, cell)
    assert error.kind == "inplace_autograd"
    assert "of shape [16, 2] (output 0 of Sigmoid)" in error.cause
    assert "`x = x + y` instead of `x += y`" in error.advice[0]


def test_nan_loss_with_on_nan_stop_names_the_step_and_the_term(shell: InteractiveShell) -> None:
    cell = """
for xb, yb in loader:
    opt.zero_grad()
    fit = nn.functional.cross_entropy(model(xb), yb)
    penalty = torch.log(torch.tensor(-1.0))
    loss = fit + penalty
    loss.backward()
    opt.step()
"""
    with pytest.raises(UsageError, match="non-finite loss at step 1"):
        shell.run_cell_magic("train", "--display text --tensorboard off --on-nan stop", cell)
    summary = last_run()
    assert summary is not None
    assert summary.error is not None
    error = summary.error
    assert error.kind == "nan_loss"
    assert "first non-finite at step 1" in error.cause
    assert "non-finite in the cell: penalty, loss" in error.cause
    assert "learning rate 0.1" in error.cause
    assert any("--on-nan skip" in a for a in error.advice)


def test_too_many_open_files_from_the_dataset(shell: InteractiveShell) -> None:
    cell = """
class Files(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 20:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), f"sample-{i}.png")
        return x[i], y[i]
for xb, yb in DataLoader(Files(), batch_size=16):
    pass
"""
    error = fails(shell, cell)
    assert error.kind == "too_many_open_files"
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert f"the open-file limit is {soft} (hard {hard})" in error.cause
    assert not error.restartable


def test_a_killed_dataloader_worker(shell: InteractiveShell) -> None:
    cell = """
class Dies(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        return x[i], y[i]
dying = DataLoader(Dies(), batch_size=16, num_workers=1, multiprocessing_context="fork")
for xb, yb in dying:
    pass
"""
    error = fails(shell, cell)
    assert error.kind == "dataloader_worker"
    assert "a worker was killed by signal Killed" in error.cause
    assert "num_workers=1" in error.cause
    assert "/dev/shm is" in error.cause
    assert error.restartable
    assert any("num_workers=0" in a for a in error.advice)


OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of "
    "which 1.06 GiB is free. Including non-PyTorch memory, this process has 22.58 GiB memory in "
    "use. Of the allocated memory 21.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved "
    "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def test_out_of_memory_states_the_figures(shell: InteractiveShell) -> None:
    # Outside the batch loop: inside it, out-of-memory is retried as micro-batches first.
    cell = STEP.format(loss="nn.functional.cross_entropy(model(xb), yb)") + (
        f"raise torch.OutOfMemoryError({OOM!r})\n"
    )
    error = fails(shell, cell)
    assert error.kind == "out_of_memory"
    assert "tried to allocate 2.00 GiB" in error.cause
    assert "1.06 GiB free of 23.65 GiB" in error.cause
    modules = [m for m in shell.user_ns.values() if isinstance(m, torch.nn.Module)]
    params = sum(p.numel() * 4 for p in {p for m in modules for p in m.parameters()})
    assert f"parameters {params} B" in error.cause
    assert "batch size 16" in error.cause
    assert error.advice[0].startswith("`%%train --accumulate 2` with batch_size=8 (now 16)")
    assert "--amp bf16" in error.advice[1]


@pytest.mark.parametrize(
    ("message", "kind", "advice"),
    [
        (
            "Expected all tensors to be on the same device, but found at least two devices, "
            "cuda:0 and cpu! (when checking argument for argument mat1 in method "
            "wrapper_CUDA_addmm)",
            "device_mismatch",
            "xb.to('cuda:0')",
        ),
        (
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, "
            "opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`",
            "cudnn_cublas",
            "CUDA_LAUNCH_BLOCKING=1",
        ),
        (
            "CUDA error: device-side assert triggered\nCUDA kernel errors might be "
            "asynchronously reported at some other API call, so the stacktrace below might be "
            "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "index_out_of_range",
            "CUDA_LAUNCH_BLOCKING=1",
        ),
    ],
    ids=["device", "cublas", "device-side-assert"],
)
def test_cuda_only_failures_through_their_real_messages(
    shell: InteractiveShell, message: str, kind: str, advice: str
) -> None:
    cell = f"""
for xb, yb in loader:
    out = model(xb)
    raise RuntimeError({message!r})
"""
    error = fails(shell, cell)
    assert error.kind == kind
    assert any(advice in a for a in error.advice)
    if kind == "device_mismatch":
        assert "on cpu: xb, yb, out" in error.cause


def test_the_explanation_comes_before_the_traceback_and_stays_in_the_record(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    # backward() runs through the session's own frame: the traceback leaves it out
    error = fails(shell, STEP.format(loss="model(xb).sigmoid().mul_(2).sum()"))
    out = capsys.readouterr().out
    assert out.index(error.text()) < out.index("Traceback")
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", out[out.index("Traceback") :])
    assert "Cell In[" in traceback
    assert "torch/_tensor.py" in traceback
    assert "jupyter_trainmate" not in traceback
    record = read_records(Path("runs"))[-1]
    assert record["outcome"] == "failed"
    assert record["error"]["kind"] == "inplace_autograd"
    assert record["error"]["advice"] == list(error.advice)


def test_the_saved_notebook_keeps_the_explanation(shell: InteractiveShell) -> None:
    """The widget's static copy (what a saved notebook shows) holds the explanation."""
    from jupyter_trainmate.display.render import html_block
    from jupyter_trainmate.display.state import RunState

    error = fails(shell, STEP.format(loss="nn.functional.cross_entropy(model(xb), yb + 3)"))
    summary = last_run()
    snap = RunState().snapshot(amp="off", loss_scale=None, skipped_steps=0, summary=summary)
    block = html_block(snap, "%%train loader")
    assert '<div class="trainmate-error"><b>index out of range</b>' in block
    assert all(html.escape(a) in block for a in error.advice)


def test_a_successful_run_has_no_error(shell: InteractiveShell) -> None:
    shell.run_cell(
        "%%train --display off --tensorboard off\n"
        + STEP.format(loss="nn.functional.cross_entropy(model(xb), yb)")
    ).raise_error()
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    assert summary.error is None


# -- trainmate explain --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "words"),
    [
        ("shape_linear.txt", "shape_mismatch", "expects 8"),
        ("oom_ipython.txt", "out_of_memory", "tried to allocate 20.00 MiB"),
        ("worker_killed.txt", "dataloader_worker", "a worker was killed by signal Killed"),
        ("target_dtype.txt", "dtype_mismatch", "target.long()"),
        ("keyerror.txt", "unknown", "'val_loss'"),
    ],
)
def test_trainmate_explain_reads_saved_tracebacks(
    name: str, kind: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", str(DATA / "tracebacks" / name), "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["kind"] == kind
    assert words in json.dumps(explained)


def test_trainmate_explain_reads_standard_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    text = (DATA / "tracebacks" / "oom_ipython.txt").read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trainmate: out of memory: the device ran out of memory")
    assert out == explain_message(*_last(text), chain=text).text() + "\n"


def _last(text: str) -> tuple[str, str]:
    from jupyter_trainmate.explain.traceback_text import last_exception

    found = last_exception(text)
    assert found is not None
    return found


def test_trainmate_explain_without_an_exception_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "log.txt"
    empty.write_text("epoch 1 loss 0.3\n")
    assert main(["explain", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no exception found" in err


# -- the labelled set of real messages -----------------------------------------------------------


def labelled(name: str = "real_errors.jsonl") -> list[dict[str, str]]:
    lines = (DATA / name).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_the_labelled_set_is_real_and_covers_every_kind() -> None:
    rows = labelled()
    assert len(rows) >= 60
    assert {row["kind"] for row in rows} == set(KINDS)
    for row in rows:
        assert row["source"].startswith("https://github.com/")
        assert "/issues/" in row["source"] or "/pull/" in row["source"]
        assert row["kind"] in KINDS


@pytest.mark.parametrize("name", ["real_errors.jsonl", "real_errors_heldout.jsonl"])
def test_accuracy_on_real_messages_and_nothing_misleading(name: str) -> None:
    """The second set was collected after the rules were written and never changed them."""
    rows = labelled(name)
    results = [classify(row["exception"], row["message"])[0] for row in rows]
    correct = sum(got == row["kind"] for got, row in zip(results, rows, strict=True))
    misleading = [
        (row["source"], row["kind"], got)
        for got, row in zip(results, rows, strict=True)
        if got != row["kind"] and got != "unknown"
    ]
    assert correct / len(rows) >= 0.9
    assert misleading == []


# -- restarts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (OSError(5, "Input/output error"), True),
        (RuntimeError("DataLoader worker (pid 4024) is killed by signal: Killed."), True),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), True),
        (RuntimeError("CUDA error: unspecified launch failure"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (16x20 and 8x16)"), False),
        (NanDetected("--on-nan stop: non-finite loss at step 3"), False),
        (KeyError("val_loss"), False),
    ],
)
def test_restartable(exc: BaseException, expected: bool) -> None:
    assert restartable(exc) is expected


RETRY_SETUP = (
    SETUP
    + """
class Flaky(Dataset):
    failed = False
    def __len__(self):
        return 64
    def __getitem__(self, i):
        global fetched
        fetched += 1
        if fetched == FAIL_AT and not Flaky.failed:
            Flaky.failed = True
            raise OSError(errno.EIO, os.strerror(errno.EIO), f"/data/sample-{i}.pt")
        return x[i], y[i]
fetched = 0
flaky = DataLoader(Flaky(), batch_size=4, shuffle=True)
"""
)

RETRY_LOOP = """
for epoch in range(3):
    for xb, yb in flaky:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
"""


def _weights(ip: InteractiveShell) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in ip.user_ns["model"].state_dict().items()}


def test_retries_recover_from_a_transient_failure_bit_identically(tmp_path: Path) -> None:
    """An I/O error while fetching step 31's batch: the run restarts from the checkpoint of step
    30 and ends with exactly the weights of a run that never failed."""
    clean = fresh_shell()
    clean.run_cell(RETRY_SETUP.replace("FAIL_AT", "-1")).raise_error()
    clean.run_cell(f"%%train --display off --tensorboard off\n{RETRY_LOOP}").raise_error()
    expected = _weights(clean)

    ip = fresh_shell()
    ip.run_cell(RETRY_SETUP.replace("FAIL_AT", str(30 * 4 + 1))).raise_error()
    line = f"--display off --tensorboard off --checkpoint {tmp_path} --retries 2"
    ip.run_cell(f"%%train {line}\n{RETRY_LOOP}").raise_error()
    got = _weights(ip)
    assert all(torch.equal(expected[k], got[k]) for k in expected), "weights differ"
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    assert any(
        e.startswith("restart 1 of 2 after a transient failure (OSError: [Errno 5] Input/output")
        for e in summary.events
    )
    records = read_records(Path("runs"))
    assert [r["outcome"] for r in records] == ["finished", "failed", "finished"]
    failed = records[1]
    assert failed["error"]["restartable"] is True
    assert any(
        "restarting from the latest checkpoint (1 of 2)" in e for e in failed["summary"]["events"]
    )
    assert "`--retries`: the run restarts from its last checkpoint" in failed["error"]["advice"][0]


def test_used_up_retries_say_the_cause_is_not_transient(tmp_path: Path) -> None:
    """The same I/O error at every fetch from the 121st: the one restart fails again, and the
    final explanation no longer suggests `--retries`."""
    ip = fresh_shell()
    setup = RETRY_SETUP.replace("FAIL_AT", "121").replace("== 121 and not Flaky.failed", ">= 121")
    ip.run_cell(setup).raise_error()
    line = f"--display off --tensorboard off --checkpoint {tmp_path} --retries 1"
    result = ip.run_cell(f"%%train {line}\n{RETRY_LOOP}")
    assert isinstance(result.error_in_exec, OSError)
    first, final = read_records(Path("runs"))
    assert "the run restarts from its last checkpoint" in first["error"]["advice"][0]
    assert final["error"]["advice"][0].startswith(
        "this run restarted 1 time(s) (--retries 1) and failed again each time"
    )


def test_a_shape_error_is_not_retried(tmp_path: Path) -> None:
    ip = fresh_shell()
    ip.run_cell(SETUP).raise_error()
    line = f"--display off --tensorboard off --checkpoint {tmp_path} --retries 2"
    cell = STEP.format(loss="nn.functional.cross_entropy(model(xb[:, :4]), yb)")
    result = ip.run_cell(f"%%train {line}\n{cell}")
    assert isinstance(result.error_in_exec, RuntimeError)
    records = read_records(Path("runs"))
    assert len(records) == 1
    assert records[0]["error"]["kind"] == "shape_mismatch"
    assert not any("restart" in e for e in records[0]["summary"]["events"])


def test_retries_need_a_checkpoint() -> None:
    ip = fresh_shell()
    with pytest.raises(UsageError, match="--retries 2: restarts resume from a checkpoint"):
        ip.run_cell_magic("train", "--retries 2", "pass")


# -- on a GPU: the real exceptions, raised by CUDA itself ---------------------------------------


@pytest.mark.gpu
def test_real_cuda_failures_are_explained_with_measured_memory() -> None:
    """Not run in the session that wrote it (no GPU was lent): a real allocation that cannot fit,
    and a layer on the GPU fed a CPU tensor."""
    ip = fresh_shell()
    ip.run_cell(SETUP + "\nmodel = model.cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)")
    step = STEP.format(loss="nn.functional.cross_entropy(model(xb), yb)")
    error = fails(ip, step + "too_big = torch.empty(2**45, device='cuda')\n")
    assert error.kind == "out_of_memory"
    assert "tried to allocate" in error.cause
    assert " free of " in error.cause  # measured with torch.cuda.mem_get_info
    assert "parameters" in error.cause
    error = fails(ip, STEP.format(loss="nn.functional.cross_entropy(model(xb.cpu()), yb)"))
    assert error.kind == "device_mismatch"
    assert "on cpu: input" in error.cause
    assert "cuda:0" in error.cause


def test_a_restarted_attempt_raises_no_toast_or_webhook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lab's toasts and the webhook read `trainmate-ended/`: the attempt that failed and
    restarted is marked there, so only the run's real end is announced (not a "failed" first)."""
    import json

    from jupyter_trainmate.runtime.status import ENDED_SUBDIR, status_dir
    from jupyter_trainmate.server.notify import find_end
    from jupyter_trainmate.server.runs import list_ended

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    ip = fresh_shell()
    ip.run_cell(RETRY_SETUP.replace("FAIL_AT", str(3 * 4 + 1))).raise_error()
    line = f"--display off --tensorboard off --checkpoint {tmp_path / 'ck'} --retries 1"
    ip.run_cell(f"%%train {line}\n{RETRY_LOOP}").raise_error()
    files = sorted((tmp_path / "runtime" / ENDED_SUBDIR).glob("*.json"))
    ended = [json.loads(f.read_text()) for f in files]
    assert sorted((e["outcome"], e["restarted"]) for e in ended) == [
        ("failed", True),
        ("finished", False),
    ]
    assert [e["outcome"] for e in list_ended(status_dir())] == ["finished"]
    (restarted,) = [e for e in ended if e["restarted"]]
    found = find_end(restarted, status_dir())
    assert found is not None
    assert found["restarted"] is True  # the notifier skips it
