"""`trainmate refactor` on synthetic notebooks of 125, 250, 500 and 1000 code cells (without
executing them), against nbconvert's script export of the same notebook in the same process.

Each notebook repeats a block of 10 code cells as real notebooks have them: constants, a function
reading notebook globals, an nn.Module, state, a loop, magics and shell lines, a display-only
cell; every name is distinct, so the analysis has as many definitions as cells. The times
include ruff formatting and the atomic write (not the pdoc HTML, `--no-docs`: it imports the
package, torch included, in about 3 s whatever the size). Goal: 500 cells in under 5 s here, and time
growing linearly with the cell count (the per-cell time should stay flat).

With `--corpus DIR` (a folder of real notebooks, see `benchmarks/refactor_corpus.toml`) the input
is real code instead: the first N code cells of the folder's notebooks in file-name order, each
notebook's markdown and outputs kept, concatenated into one notebook (N = 500 and 1000 by
default, the 1000 extending the 500). The whole command is timed as a user runs it
(`trainmate refactor NB -o OUT --no-docs --skip-bad-cells` in a subprocess: interpreter start,
imports, the write), reported in lines of code per second (non-blank lines of the code cells).
Goal: at least 1,000 lines per second and linear: the 1000-cell time over the 500-cell time
no more than 1.15 times the ratio of their lines.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat
from nbconvert import ScriptExporter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

BLOCK = [
    "LR_{i} = 1e-3\nEPOCHS_{i} = 2",
    "!pip install -q tqdm\n%matplotlib inline",
    "def scale_{i}(x):\n    return x * LR_{i} + offset_{i}",
    "offset_{i} = 0.5\nvalues_{i} = [scale_{i}(v) for v in range(10)]",
    "class Net{i}(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.fc = nn.Linear(4, 4)\n\n    def forward(self, x):\n        return self.fc(x)",
    "model_{i} = Net{i}()\nopt_{i} = torch.optim.SGD(model_{i}.parameters(), lr=LR_{i})",
    "def step_{i}(x):\n    opt_{i}.zero_grad()\n    loss = model_{i}(x).sum()\n    loss.backward()\n"
    "    opt_{i}.step()\n    return loss.item()",
    "for _ in range(EPOCHS_{i}):\n    step_{i}(torch.ones(2, 4))",
    "%%time\nresult_{i} = sum(values_{i})\nprint(f'{{result_{i}:.2f}}')",
    "result_{i}",
]


def notebook(cells: int, folder: Path) -> Path:
    nb_cells = [
        new_markdown_cell("# Synthetic"),
        new_code_cell("import torch\nfrom torch import nn"),
    ]
    i = 0
    while len(nb_cells) - 1 < cells:
        if i % 5 == 0:
            nb_cells.append(new_markdown_cell(f"## Part {i}"))
        for template in BLOCK:
            nb_cells.append(new_code_cell(template.format(i=i)))
        i += 1
    code = [c for c in nb_cells if c.cell_type == "code"][:cells]
    nb = new_notebook(cells=[c for c in nb_cells if c.cell_type != "code" or c in code])
    path = folder / f"synthetic_{cells}.ipynb"
    nbformat.write(nb, path)
    return path


def timed(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(sizes: tuple[int, ...] = (125, 250, 500, 1000), repeats: int = 3) -> dict[int, float]:
    from jupyter_trainmate.refactor.pipeline import refactor

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        exporter = ScriptExporter()
        print("cells  refactor  per cell   nbconvert --to script  ratio")
        for size in sizes:
            path = notebook(size, folder)
            ours = timed(
                lambda path=path: refactor(
                    path, folder / "out", force=True, skip_bad_cells=True, docs=False
                ),
                repeats,
            )
            theirs = timed(lambda path=path: exporter.from_filename(str(path)), repeats)
            results[size] = ours
            print(
                f"{size:5d}  {ours:7.2f} s  {1000 * ours / size:5.2f} ms  {theirs:10.3f} s"
                f"            {ours / theirs:6.1f}x"
            )
    return results


def corpus_notebook(corpus: Path, cells: int, folder: Path) -> tuple[Path, int]:
    """The first `cells` code cells of the corpus notebooks (file-name order) as one notebook;
    returns its path and its non-blank code lines."""
    taken: list[nbformat.NotebookNode] = []
    code = 0
    for source in sorted(corpus.glob("*.ipynb")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.read(source, as_version=4)
        taken.append(new_markdown_cell(f"# From {source.stem}"))
        for cell in nb.cells:
            if cell.cell_type == "code":
                if code == cells:
                    break
                code += 1
            if cell.cell_type in ("code", "markdown"):
                cell["id"] = f"cell-{len(taken)}"
                taken.append(cell)
        if code == cells:
            break
    if code < cells:
        raise SystemExit(f"{corpus}: only {code} code cells, {cells} asked")
    lines = sum(
        bool(line.strip()) for c in taken if c.cell_type == "code" for line in c.source.splitlines()
    )
    path = folder / f"corpus_{cells}.ipynb"
    nbformat.write(new_notebook(cells=taken), path)
    return path, lines


def trainmate() -> list[str]:
    script = Path(sys.executable).parent / "trainmate"
    return [str(script)] if script.exists() else [sys.executable, "-m", "jupyter_trainmate.cli"]


def command_time(path: Path, out: Path) -> tuple[float, float]:
    """The whole `trainmate refactor` command, as a user runs it: wall and CPU seconds (the CPU
    time, user + system of the command and its children, is the steadier figure on a machine
    shared with other work)."""
    if out.exists():
        shutil.rmtree(out)
    command = [*trainmate(), "refactor", str(path), "-o", str(out), "--no-docs"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([*command, "--skip-bad-cells"], capture_output=True, text=True)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise SystemExit(f"{path.name}: trainmate refactor failed: {last[0]}")
    return took, cpu


def main_corpus(corpus: Path, sizes: tuple[int, ...], repeats: int) -> dict[int, tuple[float, int]]:
    """Wall time (median of `repeats`) and lines per code-cell count; prints CPU time too."""
    results: dict[int, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("code cells  lines  whole command: wall    CPU   lines/s (wall)  per cell")
        for size in sizes:
            path, lines = corpus_notebook(corpus, size, folder)
            runs = [command_time(path, folder / "out") for _ in range(repeats)]
            took = statistics.median(w for w, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            results[size] = (took, lines)
            print(
                f"{size:10d}  {lines:5d}  {took:18.2f} s {cpu:6.2f} s {lines / took:9.0f}"
                f"       {1000 * took / size:5.1f} ms"
            )
    if len(results) >= 2:
        (small, (t1, l1)), (big, (t2, l2)) = sorted(results.items())[0], sorted(results.items())[-1]
        growth = (t2 / t1) / (l2 / l1)
        print(
            f"linearity: {big} cells take {t2 / t1:.2f}x the time of {small} for {l2 / l1:.2f}x "
            f"the lines ({growth:.2f}; 1.00 is linear)"
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="trainmate refactor speed")
    parser.add_argument("--corpus", type=Path, help="a folder of real notebooks (see docstring)")
    parser.add_argument("--sizes", type=int, nargs="+", help="code cells per notebook")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (median)")
    args = parser.parse_args()
    if args.corpus is not None:
        timed_corpus = main_corpus(args.corpus, tuple(args.sizes or (500, 1000)), args.repeats)
        rates = [lines / took for took, lines in timed_corpus.values()]
        sys.exit(0 if min(rates) >= 1000 else 1)
    found = main(tuple(args.sizes or (125, 250, 500, 1000)), args.repeats)
    sys.exit(0 if found[500] < 5.0 else 1)
