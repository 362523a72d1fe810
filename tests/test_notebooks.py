"""The bundled notebooks run top to bottom in a real kernel (nbclient)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def outputs_text(nb: nbformat.NotebookNode) -> str:
    return "".join(
        str(output.get("text", ""))
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )


@pytest.mark.slow
def test_quickstart_trains_and_runs_doctor(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    text = outputs_text(nb)
    assert f"{torch.__version__} (CPU build)" in text or f"{torch.__version__} (CUDA" in text
    assert "no check failed" in text or "some checks FAILED" in text
    losses = [
        float(line.split("train loss ")[1].split(",")[0])
        for line in text.splitlines()
        if line.startswith("epoch ")
    ]
    assert len(losses) == 5
    assert losses[-1] < losses[0]
    # the %%train summary: 5 epochs of 56 batches of 64 samples
    assert (
        "trainmate: finished after 5 epoch(s), 280 steps (280 optimizer steps), 17,920 samples"
        in text
    )
    assert "280 steps, 280 optimizer steps, 5 epochs" in text


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_bundled_notebooks_are_saved_clean(path: Path) -> None:
    """No outputs or execution counts in the repository: they are made by running them."""
    nb = json.loads(path.read_text())
    nbformat.validate(nbformat.from_dict(nb))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == []
            assert cell["execution_count"] is None
