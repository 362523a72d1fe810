"""`export()` and `bench()` with real exports, onnxruntime and torch.compile on the CPU.

Exports are shared per module (each takes seconds); tests assert facts, never timings.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import jupyter_trainmate
from jupyter_trainmate.cli import main
from jupyter_trainmate.deploy.parity import compare
from jupyter_trainmate.deploy.report import ExportReport
from jupyter_trainmate.errors import TrainmateError

pytest.importorskip("onnxruntime")  # the `export` extra, part of `dev`


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5)
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DictToTuple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(4, 3)
        self.extra = nn.Linear(2, 3)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.image(batch["image"]) + self.extra(batch["extra"])
        return hidden.relu(), hidden.sum(-1)


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, 7, batch_first=True)
        self.head = nn.Linear(7, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class Eigen(nn.Module):
    """`linalg_eigvals` has no ONNX translation in either exporter."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigvals(x).real


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deploy")


@pytest.fixture(scope="module")
def mlp_report(folder: Path) -> ExportReport:
    torch.manual_seed(1)
    xs = torch.randn(16, 64)
    loader = [(xs[:8], xs[:8, :10]), (xs[8:], xs[8:, :10])]

    def mse(output: torch.Tensor, target: torch.Tensor) -> float:
        return float(((output - target) ** 2).mean())

    return jupyter_trainmate.export(
        mlp(), torch.randn(2, 64), folder / "mlp.onnx", quantize="int8", validate=(loader, mse)
    )


def _sizes(report: ExportReport) -> set[str]:
    return {row.inputs for row in report.parity}


def test_mlp_exports_with_a_dynamic_batch_and_passes_parity(
    mlp_report: ExportReport, folder: Path
) -> None:
    report = mlp_report
    assert report.passed
    assert report.exporter == "dynamo"
    assert [a.exporter for a in report.attempts] == ["dynamo"]
    assert report.opset >= 18
    assert report.inputs[0].name == "input"
    assert report.inputs[0].shape == ("batch", 64)
    assert report.outputs[0].shape == ("batch", 10)
    assert _sizes(report) == {
        "example (batch 2)",
        "random (batch 1)",
        "random (batch 3)",
        "random (batch 8)",
    }
    assert all(row.max_abs < 1e-4 for row in report.parity)
    # One file (no external data), its report beside it, nothing left from the staging folder.
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("mlp")) == [
        "mlp.export.json",
        "mlp.int8.onnx",
        "mlp.onnx",
    ]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]
    assert not (folder / "quantize-input.onnx").exists()  # the quantiser's input stays in staging
    saved = json.loads((folder / "mlp.export.json").read_text())
    assert saved["passed"] is True
    assert saved["opset"] == report.opset
    assert saved["parity"][0]["output"] == "output"
    assert report.size == (folder / "mlp.onnx").stat().st_size


def test_int8_reports_sizes_parity_and_the_metric_of_both(mlp_report: ExportReport) -> None:
    q = mlp_report.quantization
    assert q is not None
    assert Path(q.path).name == "mlp.int8.onnx"
    assert q.size_after < 0.5 * q.size_before  # int8 weights are a quarter of float32's
    assert {row.inputs for row in q.parity} == _sizes(mlp_report)
    assert all(row.passed for row in q.parity)
    assert any(row.max_abs > 0 for row in q.parity)  # really the quantised model
    assert q.metric_float is not None
    assert q.metric_int8 is not None
    assert q.metric_int8 == pytest.approx(q.metric_float, rel=0.2)
    text = mlp_report.to_text()
    assert "int8 (dynamic, MatMul/Gemm)" in text
    assert "metric: float" in text


def test_cnn_in_train_mode_is_exported_in_eval_mode_and_left_in_train_mode(folder: Path) -> None:
    model = SmallCNN().train()
    model(torch.randn(4, 3, 8, 8))  # BatchNorm running statistics that differ from batch ones
    report = jupyter_trainmate.export(model, torch.randn(2, 3, 8, 8), folder / "cnn.onnx")
    assert report.passed, report.to_text()
    assert report.inputs[0].shape == ("batch", 3, 8, 8)
    assert model.training
    assert model.features[1].training


def test_dict_input_and_tuple_output_are_named_from_the_signature(folder: Path) -> None:
    example = {"image": torch.randn(1, 4), "extra": torch.randn(1, 2)}
    report = jupyter_trainmate.export(DictToTuple(), example, folder / "dict.onnx")
    assert report.passed, report.to_text()
    assert [s.name for s in report.inputs] == ["batch_image", "batch_extra"]
    assert [s.name for s in report.outputs] == ["output_0", "output_1"]
    assert report.outputs[1].shape == ("batch",)
    assert {r.output for r in report.parity} == {"output_0", "output_1"}
    assert "random (batch 8)" in _sizes(report)

    # I/O binding (the bench's onnxruntime path): two inputs, two outputs, the plain run's values
    from jupyter_trainmate.deploy.binding import Bound
    from jupyter_trainmate.deploy.inputs import make_example
    from jupyter_trainmate.deploy.parity import feeds, session

    sess = session(folder / "dict.onnx")
    generator = torch.Generator().manual_seed(3)
    for size in (1, 5):
        fed = feeds(sess, make_example(DictToTuple(), example).with_batch(size, generator))
        bound = Bound(sess, fed)
        bound.run()
        plain = sess.run(None, fed)
        got = bound.outputs()
        assert list(got) == ["output_0", "output_1"]
        for name, value in zip(got, plain, strict=True):
            assert got[name].shape == value.shape == ((size, 3) if name == "output_0" else (size,))
            np.testing.assert_array_equal(got[name], value)


def test_lstm_passes_parity_at_every_batch_size(folder: Path) -> None:
    report = jupyter_trainmate.export(Recurrent(), torch.randn(2, 6, 5), folder / "lstm.onnx")
    assert report.passed, report.to_text()
    assert report.inputs[0].shape == ("batch", 6, 5)
    assert len(report.parity) == 4


def test_an_operator_the_exporters_reject_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "eig.onnx"
    with pytest.raises(TrainmateError) as caught:
        jupyter_trainmate.export(Eigen(), torch.randn(2, 3, 3), path)
    message = str(caught.value)
    assert "\n" not in message
    assert "rejects operator aten.linalg_eig" in message
    assert "dynamo:" in message
    assert "torchscript:" in message
    assert [a.exporter for a in caught.value.attempts] == [  # type: ignore[attr-defined]
        "dynamo",
        "torchscript",
    ]
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no staging folder left


def test_a_model_that_fails_on_the_example_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TrainmateError, match=r"^the model does not run on the example: Runtime"):
        jupyter_trainmate.export(mlp(), torch.randn(2, 5), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_onnxruntime_names_the_pip_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(TrainmateError) as caught:
        jupyter_trainmate.export(mlp(), torch.randn(2, 64), tmp_path / "m.onnx")
    assert str(caught.value) == (
        "onnxruntime is not installed: run `pip install 'jupyter_trainmate[export]'` "
        "(or `pip install onnxruntime`)"
    )


def test_parity_failure_names_the_worst_element() -> None:
    reference = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    actual = reference.copy()
    actual[1, 0] = 3.01  # relative 3e-3: over 1e-4
    actual[0, 1] = 2.0001  # relative 5e-5: within
    row = compare("random (batch 2)", "logits", reference, actual, rtol=1e-4, atol=1e-5)
    assert not row.passed
    assert row.worst == "[1, 0]: torch 3, onnx 3.01"
    assert row.max_abs == pytest.approx(0.01, rel=1e-3)
    assert compare("x", "y", reference, reference + 1e-6, rtol=1e-4, atol=1e-5).passed
    shape = compare("x", "y", reference, reference[:1], rtol=1e-4, atol=1e-5)
    assert not shape.passed
    assert "shape [1, 2]" in shape.worst


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_trainmate")
    yield shell
    InteractiveShell.clear_instance()


def test_magic_exports_notebook_objects(
    ip: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.user_ns.update(net=Recurrent(), xb=torch.randn(3, 6, 5))
    out = tmp_path / "net.onnx"
    ip.run_line_magic("trainmate", f"export net xb -o {out} --static-batch --format json")
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True
    assert report["inputs"][0]["shape"] == [3, 6, 5]  # --static-batch: the example's size
    assert [r["inputs"] for r in report["parity"]] == ["example (batch 3)", "random (batch 3)"]
    with pytest.raises(UsageError, match=r"^%trainmate export: MODEL nope: NameError"):
        ip.run_line_magic("trainmate", "export nope xb")


NOTEBOOK_CELLS = [
    "import torch\nfrom torch import nn\n\nHIDDEN = 16\ntorch.manual_seed(0)",
    "## Model",
    "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.body = nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))\n\n"
    "    def forward(self, x):\n        return self.body(x)",
    "model = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = torch.randn(32, 4)\n"
    "data = torch.utils.data.TensorDataset(x, x[:, :2] * 2)\n"
    "loader = torch.utils.data.DataLoader(data, batch_size=8)",
    "%%train --checkpoint ckpt\nfor epoch in range(2):\n    for xb, yb in loader:\n"
    "        opt.zero_grad()\n        loss = ((model(xb) - yb) ** 2).mean()\n"
    "        loss.backward()\n        opt.step()",
]


def test_cli_exports_a_train_checkpoint_of_a_refactored_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    cells = [
        new_markdown_cell(c) if c.startswith("#") else new_code_cell(c) for c in NOTEBOOK_CELLS
    ]
    nbformat.write(new_notebook(cells=cells), tmp_path / "deploytiny.ipynb")
    package = tmp_path / "deploytiny_pkg"
    assert (
        main(["refactor", str(tmp_path / "deploytiny.ipynb"), "-o", str(package), "--no-docs"]) == 0
    )
    monkeypatch.chdir(package)
    monkeypatch.syspath_prepend(str(package))
    from deploytiny.config import Config  # type: ignore[import-not-found]
    from deploytiny.train import run  # type: ignore[import-not-found]

    trained = run(Config())[
        "model"
    ]  # the notebook's %%train cell, through jupyter_trainmate.train()
    checkpoint = sorted((package / "ckpt").glob("*-end.pt"))[-1]
    capsys.readouterr()
    argv = ["export", str(checkpoint), "--model", "deploytiny.model:Net", "--example", "2,4"]
    assert main([*argv, "-o", "net.onnx"]) == 0
    assert "(parity ok)" in capsys.readouterr().out
    import onnxruntime

    session = onnxruntime.InferenceSession("net.onnx", providers=["CPUExecutionProvider"])
    x = torch.randn(5, 4)
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():  # the trained weights, not a fresh model's
        np.testing.assert_allclose(got, trained.eval()(x).numpy(), rtol=1e-4, atol=1e-5)

    # recorded with the run that wrote the checkpoint (package/runs/, the working directory)
    from jupyter_trainmate.runtime.records import read_records
    from refactor.manifest import check

    run_record, exported = read_records(package / "runs", None)
    assert exported["kind"] == "export"
    assert exported["run"] == run_record["id"]
    assert exported["checkpoint"] == str(checkpoint)
    card = (package / "MODEL_CARD.md").read_text()
    assert card.startswith("# Model card")  # the refactor's card, its export section added
    assert "## Export (ONNX)\n\n`net.onnx`, exported on " in card
    assert card.rstrip().endswith("<!-- trainmate:export:end -->")
    check(tmp_path / "deploytiny.ipynb", package, force=True)  # still the refactor's own file
    # a new refactor replaces the card and writes the section itself from the notebook's records
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "runs.jsonl").write_text((package / "runs" / "runs.jsonl").read_text())
    notebook = str(tmp_path / "deploytiny.ipynb")
    assert main(["refactor", notebook, "-o", str(package), "--force", "--no-docs"]) == 0
    again = (package / "MODEL_CARD.md").read_text()
    assert again.count("## Export (ONNX)\n\n`net.onnx`, exported on ") == 1
    assert "The notebook's recorded `%%train` runs" in again  # the run, not the export line

    assert main(["export", str(checkpoint), "--example", "2,4"]) == 2
    assert "add --model PKG.module:builder" in capsys.readouterr().err
    assert (
        main(["export", str(checkpoint), "--model", "deploytiny.model:Nope", "--example", "2"]) == 2
    )
    assert "has no attribute 'Nope'" in capsys.readouterr().err
    net = ["export", str(checkpoint), "--model", "deploytiny.model:Net"]
    assert main([*net, "--example", "2,four"]) == 2
    assert "--example 2,four: give SHAPE[:DTYPE]" in capsys.readouterr().err
    assert main([*net, "--example", "2,4:int64"]) == 2
    assert "the model does not run on the example: RuntimeError" in capsys.readouterr().err


def test_bench_table_has_eager_compile_and_onnxruntime_rows() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    report = jupyter_trainmate.bench(
        model,
        torch.randn(2, 16),
        batch_sizes=(1, 4),
        precision=("fp32", "fp16"),
        min_run_time=0.01,
    )
    measured = [r for r in report.rows if r.measured]
    assert {(r.backend, r.batch_size) for r in measured} == {
        (b, n) for b in ("eager", "compile", "onnxruntime") for n in (1, 4)
    }
    for row in measured:
        assert row.precision == "fp32"
        assert row.p50_ms is not None
        assert row.p95_ms is not None
        assert row.p99_ms is not None
        assert 0 < row.p50_ms <= row.p95_ms <= row.p99_ms
        assert row.samples_per_s == pytest.approx(row.batch_size / (row.p50_ms / 1e3))
        assert row.blocks >= 10
        assert row.timed_calls >= row.blocks
        assert row.peak_memory_mb is not None
        assert row.peak_memory_mb > 0
        if row.backend == "compile":
            assert row.recompiles == 0  # nothing compiled inside the timed region
            assert row.compile_s is not None
        else:
            assert row.recompiles is None
            assert row.compile_s is None
        if row.backend == "onnxruntime":
            assert row.note == "CPU provider, I/O binding"
    first_compile = next(r for r in measured if r.backend == "compile")
    assert first_compile.compile_s is not None
    assert first_compile.compile_s > 0
    skipped = [r for r in report.rows if not r.measured]
    assert len(skipped) == 6
    assert all(r.precision == "fp16" and r.skipped for r in skipped)
    assert report.threads == torch.get_num_threads()
    verdicts = report.verdicts()
    assert [v.split(":")[0] for v in verdicts] == ["batch 1", "batch 4"]
    markdown = report.to_markdown()
    assert "| backend | precision | batch | p50 ms |" in markdown
    assert "compile s" in markdown
    assert "skipped: fp16 on a CPU" in markdown
    assert json.loads(report.to_json())["verdicts"] == verdicts
    assert model.training  # bench left the model's mode alone


def test_bench_rejects_unknown_choices() -> None:
    with pytest.raises(TrainmateError, match="unknown backend 'tensorrt'"):
        jupyter_trainmate.bench(mlp(), torch.randn(1, 64), backends=("tensorrt",))


def test_bench_an_exported_file_from_the_shell(
    mlp_report: ExportReport, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", str(folder / "mlp.onnx"), "--example", "2,64", "--batch-sizes", "1,3"]
    assert main([*argv, "--min-run-time", "0.01", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = [(r["backend"], r["precision"], r["batch_size"]) for r in report["rows"]]
    assert rows == [("onnxruntime", p, n) for p in ("fp32", "bf16") for n in (1, 3)]
    assert all(r["p50_ms"] > 0 for r in report["rows"][:2])
    assert all(r["skipped"] for r in report["rows"][2:])
    assert main([*argv, "--example", "2,3"]) == 2
    assert "has 1 input(s) (input): give as many examples, not 2" in capsys.readouterr().err


def test_magic_bench_on_notebook_objects(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.user_ns.update(net=mlp(), xb=torch.randn(2, 64))
    options = "--backends eager --precision fp32 --batch-sizes 1,2 --min-run-time 0.01"
    ip.run_line_magic("trainmate", f"bench net xb {options} --clock cpu --format markdown")
    out = capsys.readouterr().out
    assert "1 thread(s), min run time 0.01 s per row in 5 interleaved round(s), CPU time" in out
    assert "| eager | fp32 | 1 |" in out
    assert "| eager | fp32 | 2 |" in out
    assert "- batch 2: fastest is eager fp32" in out


@pytest.mark.slow
def test_deploy_notebook_trains_exports_quantises_and_benches(tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "deploy.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert last.startswith("parity ok (dynamo, opset ")
    assert "int8 " in last
    assert "batch 64: fastest is" in last
    saved = json.loads((tmp_path / "classifier.export.json").read_text())
    assert saved["passed"] is True
    assert saved["quantization"]["metric_int8"] is not None
    assert (tmp_path / "classifier.int8.onnx").is_file()


def test_bench_html_has_the_table_and_a_latency_chart() -> None:
    from jupyter_trainmate.deploy.bench_report import BenchReport, BenchRow

    rows = (
        BenchRow("eager", "fp32", 1, 1.0, 1.2, 1.3, 1000.0, 300.0, timed_calls=10, blocks=10),
        BenchRow("eager", "fp32", 8, 2.0, 2.2, 2.3, 4000.0, 300.0, timed_calls=10, blocks=10),
        BenchRow("onnxruntime", "fp32", 1, 0.5, 0.6, 0.7, 2000.0, 300.0, timed_calls=10, blocks=10),
        BenchRow("onnxruntime", "fp32", 8, 4.0, 4.1, 4.2, 2000.0, 300.0, timed_calls=10, blocks=10),
        BenchRow("compile", "bf16", 1, skipped="this CPU has no bf16 instructions"),
    )
    report = BenchReport(rows, "CPU", 1, "peak RSS", 0.1, {})
    assert report.verdicts() == [
        "batch 1: fastest is onnxruntime fp32, 0.5 ms p50, 2,000 samples/s (2.00x eager fp32)",
        "batch 8: fastest is eager fp32, 2 ms p50, 4,000 samples/s",
    ]
    page = report._repr_html_()
    assert page.count("<tr>") == 6
    assert "skipped: this CPU has no bf16 instructions" in page
    assert page.count("<polyline") == 2  # eager fp32 and onnxruntime fp32 against batch size
    assert "batch size" in page
    assert "Warning" not in page

    from jupyter_trainmate.deploy.measure import busy_note

    assert busy_note("wall", 1.5, 2) == ""
    assert busy_note("cpu", 7.5, 2) == ""  # the CPU clock leaves the others' share out
    busy = BenchReport(rows, "CPU", 1, "peak RSS", 0.1, {}, busy=busy_note("wall", 7.5, 2))
    warning = "Warning: the machine was busy (load average 7.5 on 2 cores): wall-clock times"
    assert warning in busy.to_markdown()
    assert warning in busy.to_html()


class BakedBatch(nn.Module):
    """Runs at any batch size in PyTorch, but `int()` of a shape fixes it in an exported graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(int(x.shape[0]), dtype=x.dtype).unsqueeze(1)


def test_a_batch_axis_the_export_fixed_fails_parity_and_says_why(tmp_path: Path) -> None:
    report = jupyter_trainmate.export(BakedBatch(), torch.randn(2, 4), tmp_path / "baked.onnx")
    assert not report.passed
    assert report.inputs[0].shape == (2, 4)
    assert any("batch axis of input x is fixed at 2" in w for w in report.warnings)
    failed = {r.inputs: r.worst for r in report.parity if not r.passed}
    assert set(failed) == {"random (batch 1)", "random (batch 3)", "random (batch 8)"}
    assert failed["random (batch 3)"].startswith("onnxruntime fails on inputs of batch size 3")
    assert "FAILED" in report.to_text()
    assert (tmp_path / "baked.onnx").is_file()  # written: the report is the user's to read


TRAIN_LOOP = """
for epoch in range(1):
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
"""


def test_notebook_export_and_bench_are_recorded_with_the_run_that_trained_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jupyter_trainmate.report import build_report
    from jupyter_trainmate.report.markdown import render_markdown
    from jupyter_trainmate.runs_table import text_table
    from jupyter_trainmate.runtime.records import read_records

    from .train_harness import COMMON, run

    quick = "--backends eager --precision fp32 --batch-sizes 1 --min-run-time 0.01"
    ip = run([COMMON], None)
    ip.run_line_magic("trainmate", f"bench model x[:2] {quick} --format json")
    assert not (tmp_path / "runs").exists()  # no %%train run yet: nothing to attach to
    ip.run_cell(f"%%train --display off\n{TRAIN_LOOP}").raise_error()
    ip.run_line_magic("trainmate", "export model x[:2] -o model.onnx --format json")
    ip.run_line_magic("trainmate", f"bench model x[:2] {quick} --format json")
    # the exported file, from a shell: the run its export was recorded with
    onnx = ["bench", "model.onnx", "--example", "2,8", "--batch-sizes", "1", "--precision", "fp32"]
    assert main([*onnx, "--min-run-time", "0.01"]) == 0
    assert "trainmate bench: recorded in " in capsys.readouterr().err

    (trained,) = read_records(tmp_path / "runs")  # readers of runs see only the run
    lines = read_records(tmp_path / "runs", None)
    assert [line.get("kind") for line in lines] == [None, "export", "bench", "bench"]
    assert all(line["run"] == trained["id"] for line in lines[1:])
    assert lines[1]["export"]["path"] == "model.onnx"
    assert lines[1]["model"] == str(tmp_path / "model.onnx")
    assert lines[2]["bench"]["rows"][0]["backend"] == "eager"
    assert lines[3]["model"] == str(tmp_path / "model.onnx")
    assert lines[3]["bench"]["rows"][0]["backend"] == "onnxruntime"
    assert len(text_table(read_records(tmp_path / "runs")).splitlines()) == 2  # header + 1 run

    report = build_report(tmp_path / "runs")
    assert len(report.runs.rows) == 1
    assert report.deploy is not None
    rows = report.deploy.rows
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("#1", "export", "model.onnx"),
        ("#1", "bench", "-"),
        ("#1", "bench", "model.onnx"),
    ]
    assert rows[0][4].startswith("parity ok; ")
    assert rows[1][4].startswith("batch 1: fastest is eager fp32")
    text, _ = render_markdown(report, "report")
    assert "## Exports and benchmarks" in text

    jupyter_trainmate.export(ip.user_ns["model"], torch.randn(2, 8), "again.onnx", record=False)
    assert len(read_records(tmp_path / "runs", None)) == 4


def test_the_cards_export_section_is_replaced_in_place_and_the_users_text_kept(
    mlp_report: ExportReport, tmp_path: Path
) -> None:
    import hashlib

    from jupyter_trainmate.deploy.card import END, START, update_card

    card = tmp_path / "MODEL_CARD.md"
    card.write_text("# Model card\n\n## Metrics\n\nmine\n")
    manifest = tmp_path / ".trainmate-refactor.json"
    digest = hashlib.sha256(card.read_bytes()).hexdigest()
    manifest.write_text(json.dumps({"files": {"MODEL_CARD.md": digest}, "notebook": {}}))
    data = json.loads(mlp_report.to_json())

    update_card(card, data, "on 2026-12-01")
    first = card.read_text()
    assert first.startswith("# Model card\n\n## Metrics\n\nmine\n\n" + START)
    assert "`mlp.onnx`, exported on 2026-12-01 by `trainmate export` with the dynamo" in first
    assert (
        "**ok** on example (batch 2), random (batch 1), random (batch 3), random (batch 8)" in first
    )
    assert "- int8 (dynamic, MatMul/Gemm): `mlp.int8.onnx`" in first
    kept = json.loads(manifest.read_text())["files"]["MODEL_CARD.md"]
    assert kept == hashlib.sha256(card.read_bytes()).hexdigest()  # still the refactor's own

    card.write_text(first.replace("mine", "mine, edited") + "\n## Notes\n\nafter\n")
    update_card(card, {**data, "opset": 99}, "on 2026-12-02")
    second = card.read_text()
    assert second.count(START) == 1
    assert second.count(END) == 1
    assert "ONNX opset 99" in second
    assert "2026-12-01" not in second
    assert "mine, edited" in second
    assert second.endswith("## Notes\n\nafter\n")
    assert json.loads(manifest.read_text())["files"]["MODEL_CARD.md"] == kept  # the user's now

    card.write_text(f"# Card\n{START}\nhalf\n")
    with pytest.raises(TrainmateError, match="one export marker without the other"):
        update_card(card, data)
    assert card.read_text() == f"# Card\n{START}\nhalf\n"


class _Row:
    """A row for `measure_rounds`: its context logs when it is timed."""

    def __init__(self, number: int, log: list[int], work: int = 0, sleep: float = 0.0) -> None:
        self.batch = 1
        self.number = number
        self.log = log
        self.work = work
        self.sleep = sleep

    def call(self) -> None:
        sum(range(self.work))
        if self.sleep:
            import time

            time.sleep(self.sleep)

    def context(self) -> contextlib.AbstractContextManager[None]:
        self.log.append(self.number)
        return contextlib.nullcontext()


def test_rows_are_timed_interleaved_in_rotating_rounds() -> None:
    from jupyter_trainmate.deploy.measure import MIN_BLOCKS, measure_rounds

    log: list[int] = []
    rows = [_Row(i, log) for i in range(3)]
    results = measure_rounds(rows, 0.003, 3, 1, "wall", None)
    assert log[:9] == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert all(timing.blocks >= MIN_BLOCKS for timing, _ in results)
    assert all(peak is None for _, peak in results)


def test_each_round_weighs_the_same_in_every_percentile() -> None:
    from jupyter_trainmate.deploy.measure import _round_percentiles

    # The first round's autorange gave 60 fast blocks, two later rounds one slow block each (a
    # burst of other work): the median is the slow rounds' (two rounds of three), and no
    # percentile lies below it (a median of medians beside pooled percentiles put p50 above p95).
    p50, p95, p99 = _round_percentiles([[1.0] * 60, [10.0], [10.0]], (50, 95, 99))
    assert (p50, p95, p99) == (10.0, 10.0, 10.0)
    # Rounds of equal sizes: the pooled percentiles.
    p50, p95, p99 = _round_percentiles([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], (50, 95, 99))
    assert (p50, p95, p99) == (4.0, 8.0, 8.0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        rounds = [
            torch.rand(int(torch.randint(1, 40, (1,), generator=generator)), generator=generator)
            .mul(float(torch.rand(1, generator=generator)) * 10)
            .tolist()
            for _ in range(5)
        ]
        p50, p95, p99 = _round_percentiles(rounds, (50, 95, 99))
        assert min(map(min, rounds)) <= p50 <= p95 <= p99 <= max(map(max, rounds))


def test_the_cpu_clock_leaves_out_time_off_the_core() -> None:
    from jupyter_trainmate.deploy.measure import measure_rounds

    # A 5 ms sleep takes no CPU time; the work beside it takes well under 1 ms of it on any machine
    # (CI once ran 20,000 additions 30% slower under the wall clock than under the CPU clock, so the
    # margin is the sleep's, not the work's).
    row = _Row(0, [], work=2_000, sleep=0.005)
    ((wall, _),) = measure_rounds([row], 0.05, 1, 1, "wall", None)
    ((cpu, _),) = measure_rounds([row], 0.05, 1, 1, "cpu", None)
    assert wall.p50_ms >= 5.0
    assert cpu.p50_ms < 2.5
    with pytest.raises(TrainmateError, match="needs 1 thread, not 2"):
        jupyter_trainmate.bench(mlp(), torch.randn(1, 64), clock="cpu", threads=2)
    with pytest.raises(TrainmateError, match="unknown clock 'gpu'"):
        jupyter_trainmate.bench(mlp(), torch.randn(1, 64), clock="gpu")
