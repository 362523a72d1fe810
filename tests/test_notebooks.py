"""The bundled notebooks run top to bottom in a real kernel (nbclient)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            parts.append(str(output.get("text", "")))
            parts.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def execute(name: str, folder: Path) -> nbformat.NotebookNode:
    """Run a bundled notebook top to bottom in a fresh kernel working in `folder`."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(folder)}},
    ).execute()
    return nb


def final_displays(nb: nbformat.NotebookNode) -> list[str]:
    """What each `%%train` cell left as its last display (the run's final state): the summary
    line, then the static picture of the widget (HTML), where the advice and events are."""
    found = []
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("%%train"):
            displays = [o for o in cell.outputs if o.output_type == "display_data"]
            data = displays[-1]["data"] if displays else {}
            found.append(f"{data.get('text/plain', '')}\n{data.get('text/html', '')}")
    return found


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    return execute("quickstart.ipynb", tmp_path_factory.mktemp("quickstart"))


@pytest.mark.slow
def test_input_bound_notebook_names_the_cause_and_tune_loader_reports(
    tmp_path: Path,
) -> None:
    nb = execute("input_bound.ipynb", tmp_path)
    plain, tuned = final_displays(nb)
    assert "num_workers=0: raise it" in plain  # the advice from the measured data wait
    text = outputs_text(nb)
    (report,) = [line for line in text.splitlines() if line.startswith("--tune-loader:")]
    assert report.count("ms/batch") == 3  # num_workers 0, 1 and 2 on this 2-CPU machine
    assert report.count("<- used") == 1
    assert "2,048 samples" in tuned  # the tuned run trained on every sample, none twice


@pytest.mark.slow
def test_refactor_notebook_shows_the_package_its_tests_pass_and_it_trains(tmp_path: Path) -> None:
    nb = execute("refactor_to_package.ipynb", tmp_path)
    text = outputs_text(nb)
    assert "trainmate refactor: wrote spiral_pkg" in text
    assert "spiral_pkg/spiral/__main__.py" in text
    (summary,) = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    assert " passed" in summary
    assert "failed" not in summary
    assert "final loss" in text.split(summary)[1]  # `python -m spiral train` ran the training
    assert (tmp_path / "spiral.ipynb").exists()  # the notebook the refactor read is untouched


@pytest.mark.slow
def test_resilience_notebook_interrupts_resumes_skips_a_nan_and_stops_early(
    tmp_path: Path,
) -> None:
    nb = execute("resilience.ipynb", tmp_path)
    interrupted, resumed, _, early = final_displays(nb)
    assert interrupted.startswith("trainmate: interrupted after 2 epoch(s), 30 steps")
    assert "continue with %%train --resume" in interrupted
    # 4 epochs of 24 batches: the 30 done before the interruption are not repeated
    assert resumed.startswith("trainmate: finished after 3 epoch(s), 66 steps")
    text = outputs_text(nb)
    assert "non-finite loss at step 6: batch skipped (--on-nan skip)" in text
    assert "weights finite" in text
    assert early.startswith("trainmate: stopped early after 3 epoch(s)")
    assert list((tmp_path / "ckpt").glob("*.pt"))


@pytest.mark.slow
def test_quickstart_trains_and_runs_doctor(quickstart: nbformat.NotebookNode) -> None:
    text = outputs_text(quickstart)
    assert f"{torch.__version__} (CPU build)" in text or f"{torch.__version__} (CUDA" in text
    assert "no check failed" in text or "some checks FAILED" in text
    losses = [
        float(line.split("train loss ")[1].split(",")[0])
        for line in text.splitlines()
        if line.startswith("epoch ")
    ]
    assert len(losses) == 10
    assert losses[-1] < losses[0]
    # the %%train summary: 10 epochs of 112 batches of 64 samples
    assert (
        "trainmate: finished after 10 epoch(s), 1,120 steps (1,120 optimizer steps), 71,680 samples"
        in text
    )
    assert "1120 steps, 1120 optimizer steps, 10 epochs" in text


@pytest.mark.slow
def test_saved_quickstart_keeps_the_widget_state_and_a_readable_summary(
    quickstart: nbformat.NotebookNode,
) -> None:
    state = quickstart.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = [m["state"] for m in state.values()]
    bars = [m for m in models if m.get("_model_name") == "FloatProgressModel"]
    assert [b["value"] for b in bars] == [1.0]
    assert bars[0]["bar_style"] == "success"
    html_values = [m.get("value", "") for m in models if m.get("_model_name") == "HTMLModel"]
    assert any(
        "<svg" in v and 'data-series="loss"' in v and 'data-series="val_accuracy"' in v
        for v in html_values
    )
    assert any("epoch 10/10" in v for v in html_values)
    (train_cell,) = [
        c for c in quickstart.cells if c.cell_type == "code" and c.source.startswith("%%train")
    ]
    displays = [o for o in train_cell.outputs if o.output_type == "display_data"]
    assert "application/vnd.jupyter.widget-view+json" in displays[0]["data"]
    final = displays[-1]["data"]
    assert final["text/plain"].startswith("trainmate: finished after 10 epoch(s)")
    assert "<svg" in final["text/html"]
    assert "100% | epoch 10/10" in final["text/html"]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_bundled_notebooks_are_saved_clean(path: Path) -> None:
    """No outputs or execution counts in the repository: they are made by running them."""
    nb = json.loads(path.read_text())
    nbformat.validate(nbformat.from_dict(nb))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == []
            assert cell["execution_count"] is None


@pytest.mark.slow
def test_notebook_functions_are_instrumented_with_tmpdir_outside_tmp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ipykernel names cell files under `tempfile.gettempdir()` (`/var/folders/...` on macOS)."""
    import shutil
    import tempfile

    from .train_harness import COMMON

    folder = Path(tempfile.mkdtemp(prefix="trainmate-", dir="/var/tmp"))
    try:
        monkeypatch.setenv("TMPDIR", str(folder))  # the kernel inherits it
        fit = (
            "def fit():\n    for xb, yb in loader:\n        opt.zero_grad()\n"
            "        loss_fn(model(xb), yb).backward()\n        opt.step()\n"
        )
        report = (
            "from jupyter_trainmate import last_run\n"
            "print('STEPS', last_run().steps)\nprint('FILE', fit.__code__.co_filename)\n"
        )
        nb = nbformat.v4.new_notebook()
        nb.cells = [
            nbformat.v4.new_code_cell(s)
            for s in [
                "%load_ext jupyter_trainmate\n" + COMMON,
                fit,
                "%%train --show\nfit()",
                "%%train --display text\nfit()",
                report,
            ]
        ]
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
        ).execute()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    text = outputs_text(nb)
    assert f"FILE {folder}" in text  # the cell file is where TMPDIR points, not under /tmp
    assert "STEPS 8" in text
    assert "# instrumented function fit line 2: batch loop over loader" in text
    assert "nothing: the cell runs unchanged" not in text
