"""
The working folder of `--execute` and `--check-equivalence`: fresh, holding a copy of the files
beside the notebook.

A notebook reads its data where Jupyter runs it, in its own folder (`np.loadtxt("prices.csv")`,
`pd.read_csv("data/train.csv")`). Both runs happen in a fresh temporary folder, so that nothing
they write lands among the user's files; run there with nothing in it, such a notebook stops at
its first read. So each run's folder gets a copy of what lies beside the notebook (not a link:
a notebook that writes `model.pt` over a file of the same name must not change the user's), up
to `LIMIT` bytes in all. Left out: hidden entries, caches, other notebooks' checkpoints, and the
folders an earlier refactor wrote (they hold the refactor's manifest).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from . import manifest

LIMIT = 512 * 2**20  # bytes copied at most: beyond it a data set is not copied, and a read says so
SKIP = {"__pycache__", ".ipynb_checkpoints", "node_modules"}


def _entries(folder: Path, notebook: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.iterdir()
        if not p.name.startswith(".")
        and p.name not in SKIP
        and p != notebook
        and not (p.is_dir() and (p / manifest.NAME).exists())
        and not p.is_symlink()  # a link may point anywhere (a whole disk): not ours to copy
    )


def _size(path: Path, budget: int) -> int:
    """Bytes under `path`, counting stops once past `budget`."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
            if total > budget:
                break
    return total


def stage(notebook: Path, into: Path) -> list[str]:
    """Copy the files beside `notebook` into `into`; returns the entries left out for size."""
    left: list[str] = []
    budget = LIMIT
    for entry in _entries(notebook.resolve().parent, notebook.resolve()):
        size = _size(entry, budget)
        if size > budget:
            left.append(entry.name)
            continue
        budget -= size
        if entry.is_dir():
            ignore = shutil.ignore_patterns(".*", *SKIP)
            shutil.copytree(entry, into / entry.name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(entry, into / entry.name)
    return left
