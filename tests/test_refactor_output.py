"""Where `trainmate refactor` writes: never over the user's files, `--force` replaces only what an
earlier refactor wrote (its manifest), and notebooks without cell ids are read without noise."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MANIFEST = ".trainmate-refactor.json"


def trainmate(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_trainmate", "refactor", *map(str, args), "--no-docs"],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def notebook(path: Path, minor: int, *, with_file: bool) -> Path:
    """A small notebook as nbformat 4.`minor` writes it, its cells without ids."""
    cells = [
        ("markdown", "# Scale\nA number, scaled."),
        ("code", "SCALE = 3\n\ndef scaled(x):\n    return x * SCALE"),
        ("code", "print(scaled(2))"),
    ]
    if with_file:  # %%writefile: a file in the package that the second version no longer has
        cells.append(("code", "%%writefile settings.txt\nscale = 3"))
    nb = {
        "nbformat": 4,
        "nbformat_minor": minor,
        "metadata": {},
        "cells": [
            {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
            | ({"execution_count": None, "outputs": []} if kind == "code" else {})
            for kind, source in cells
        ],
    }
    path.write_text(json.dumps(nb, indent=1))
    return path


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def first(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A 4.5 notebook without cell ids, refactored once into a new folder."""
    base = tmp_path_factory.mktemp("first")
    nb = notebook(base / "nb.ipynb", 5, with_file=True)
    return nb, trainmate(nb, "-o", base / "pkg")


@pytest.mark.parametrize("minor", [4, 5])
def test_notebooks_without_cell_ids_are_read_without_warnings(minor: int, tmp_path: Path) -> None:
    nb = notebook(tmp_path / "nb.ipynb", minor, with_file=False)
    before = nb.read_bytes()
    proc = trainmate(nb, "--dry-run")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "## Cells" in proc.stdout
    assert nb.read_bytes() == before  # ids are filled in memory, never in the file


def test_a_refactor_writes_its_manifest_and_nothing_on_stderr(
    first: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    nb, proc = first
    assert (proc.returncode, proc.stderr) == (0, "")
    out = nb.parent / "pkg"
    # the command ends with os._exit (no interpreter teardown): its line still reaches a pipe
    assert proc.stdout == f"trainmate refactor: wrote {out} (see {out / 'REFACTOR_REPORT.md'})\n"
    manifest = json.loads((out / MANIFEST).read_text())
    written = files_of(out)
    del written[MANIFEST]
    assert sorted(manifest["files"]) == sorted(written)
    assert "settings.txt" in manifest["files"]
    assert manifest["notebook"]["name"] == "nb.ipynb"


@pytest.mark.parametrize(
    ("where", "force"),
    [("folder", False), ("folder", True), ("dot", True), ("above", True)],
)
def test_the_notebooks_own_folder_is_refused_and_left_untouched(
    where: str, force: bool, tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    nb = notebook(folder / "nb.ipynb", 4, with_file=False)
    (folder / "data.csv").write_text("x,y\n1,2\n")
    before = files_of(tmp_path)
    extra = ["--force"] if force else []
    if where == "dot":  # from inside the folder: `-o .` once ended in an OSError traceback
        proc = trainmate("nb.ipynb", "-o", ".", *extra, cwd=folder)
        named = "."
    else:
        target = folder if where == "folder" else tmp_path
        proc = trainmate(nb, "-o", target, *extra)
        named = str(target)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        f"trainmate refactor: error: {named}: holds the notebook nb.ipynb"
    )
    assert "choose a new folder with -o" in proc.stderr
    assert files_of(tmp_path) == before


def test_force_refuses_a_folder_of_files_it_did_not_write(tmp_path: Path) -> None:
    nb = notebook(tmp_path / "nb.ipynb", 4, with_file=False)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.md").write_text("my notes")
    proc = trainmate(nb, "-o", out, "--force")
    assert (proc.returncode, proc.stderr.count("\n")) == (2, 1)
    assert "holds files trainmate refactor did not write (notes.md)" in proc.stderr
    assert files_of(out) == {"notes.md": b"my notes"}


def test_force_replaces_only_what_the_first_refactor_wrote(
    first: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out = tmp_path / "pkg"
    shutil.copytree(first[0].parent / "pkg", out)
    nb = notebook(tmp_path / "nb.ipynb", 5, with_file=False)  # the second version: no settings.txt
    (out / "data.csv").write_text("x,y\n1,2\n")
    (out / "nb" / "notes.py").write_text("# mine\n")
    readme = out / "README.md"
    readme.write_text(readme.read_text() + "\nMy edit.\n")
    before = files_of(out)

    edited = trainmate(nb, "-o", out, "--force")
    assert (edited.returncode, edited.stderr.count("\n")) == (2, 1), edited.stderr
    assert f"{readme}: changed since trainmate refactor wrote it" in edited.stderr
    assert files_of(out) == before  # refused before anything was written

    readme.unlink()  # what the message says to do
    again = trainmate("../nb.ipynb", "-o", ".", "--force", cwd=out)  # from inside the folder
    assert (again.returncode, again.stderr) == (0, ""), again.stderr
    after = files_of(out)
    assert "settings.txt" not in after  # written by the first run only: removed
    assert after["data.csv"] == b"x,y\n1,2\n"  # the user's files are kept
    assert after["nb/notes.py"] == b"# mine\n"
    assert "README.md" in after
    manifest = json.loads(after.pop(MANIFEST))
    assert "pending" not in manifest
    assert sorted(manifest["files"]) == sorted(set(after) - {"data.csv", "nb/notes.py"})
    assert [p.name for p in out.iterdir() if p.name.startswith(".trainmate-refactor-tmp")] == []


def test_force_refuses_a_file_of_the_users_where_the_package_puts_one(
    first: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out = tmp_path / "pkg"
    shutil.copytree(first[0].parent / "pkg", out)
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest["files"]["MODEL_CARD.md"]  # as if an earlier refactor had not written it
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "MODEL_CARD.md").write_text("my card")
    before = files_of(out)
    proc = trainmate(first[0], "-o", out, "--force")
    assert (proc.returncode, proc.stderr.count("\n")) == (2, 1), proc.stderr
    assert "MODEL_CARD.md: a file of yours is where the package puts MODEL_CARD.md" in proc.stderr
    assert files_of(out) == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".trainmate-refactor-tmp")] == []
