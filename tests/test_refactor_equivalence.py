"""`--execute --check-equivalence` on the failure classes real notebooks showed when run
(benchmarks/refactor_equivalence.py): a notebook that never seeds (or builds a vocabulary from a
`set`) must be compared from the same random and hash state, and a notebook that reads its data
beside itself must find it, in both runs, without either run changing the user's folder. Our own
notebooks (tests/notebooks/equiv_*.ipynb, a second each on a CPU) reproduce them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .cli_harness import trainmate

NOTEBOOKS = Path(__file__).parent / "notebooks"
CASES = {
    "equiv_unseeded": ["equiv_unseeded.ipynb"],
    "equiv_local_data": ["equiv_local_data.ipynb", "equiv_local_data.csv"],
}
USERS_MODEL = b"the user's own model.pt"


@pytest.fixture(scope="module")
def executed(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[subprocess.CompletedProcess[str], Path, Path]]:
    """Each notebook, alone in a folder of the user's (with its data and a `model.pt` of the
    user's), refactored with `--execute --check-equivalence` into another folder."""
    base = tmp_path_factory.mktemp("equivalence")
    out = {}
    for name, files in CASES.items():
        home = base / name / "home"
        home.mkdir(parents=True)
        for file in files:
            shutil.copy(NOTEBOOKS / file, home / file)
        (home / "model.pt").write_bytes(USERS_MODEL)
        folder = base / name / "out"
        proc = trainmate(
            "refactor", home / files[0], "-o", folder, "--execute", "--check-equivalence",
            "--no-docs",
        )  # fmt: skip
        out[name] = (proc, folder, home)
    return out


def rows(folder: Path) -> dict[str, str]:
    report = (folder / "REFACTOR_REPORT.md").read_text()
    table = report.split("## Equivalence")[1].split("\n## ")[0]
    return {r.split("`")[1]: r for r in table.splitlines() if r.startswith("| `")}


def test_an_unseeded_notebook_is_compared_from_the_same_random_state(
    executed: dict[str, tuple[subprocess.CompletedProcess[str], Path, Path]],
) -> None:
    proc, folder, _ = executed["equiv_unseeded"]
    assert proc.returncode == 0, proc.stderr
    table = rows(folder)
    assert {"final_loss", "encoded"} <= table.keys()  # the trained loss, the set-built codes
    assert all(r.endswith("| yes |") for r in table.values()), table


def test_a_notebook_reads_its_data_beside_itself_and_leaves_the_folder_alone(
    executed: dict[str, tuple[subprocess.CompletedProcess[str], Path, Path]],
) -> None:
    proc, folder, home = executed["equiv_local_data"]
    assert proc.returncode == 0, proc.stderr
    table = rows(folder)
    assert "final_loss" in table, table
    assert table["final_loss"].endswith("| yes |"), table
    # both runs saved model.pt in their own fresh folder: the user's is as it was, nothing new
    assert (home / "model.pt").read_bytes() == USERS_MODEL
    assert sorted(p.name for p in home.iterdir()) == sorted(
        ["equiv_local_data.ipynb", "equiv_local_data.csv", "model.pt"]
    )


def test_a_data_set_too_large_to_copy_is_named_when_a_read_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_trainmate.refactor import workdir

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "big.bin").write_bytes(b"x" * 64)
    (home / "small.csv").write_text("1,2\n")
    (home / ".git").mkdir()
    (home / "nb.ipynb").write_text("{}")
    monkeypatch.setattr(workdir, "LIMIT", 16)
    into = tmp_path / "into"
    into.mkdir()
    assert workdir.stage(home / "nb.ipynb", into) == ["data"]
    assert sorted(p.name for p in into.iterdir()) == ["small.csv"]  # no notebook, no .git


def test_a_data_set_download_that_fails_is_named_as_needing_the_network(tmp_path: Path) -> None:
    """torchvision's MNIST(download=True) without a network (the DTU course notebook): it tries
    each mirror, then raises a RuntimeError that names neither the network nor a file."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = tmp_path / "downloads.ipynb"
    failing = "raise RuntimeError('Error downloading train-images-idx3-ubyte.gz:\\nTried x')"
    cells = [new_code_cell("import os"), new_code_cell(failing)]
    nbformat.write(new_notebook(cells=cells), notebook)
    proc = trainmate("refactor", notebook, "-o", tmp_path / "out", "--execute", "--no-docs")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "cell 2 needs the network (RuntimeError: Error downloading" in proc.stderr
