"""`trainmate refactor` on synthetic notebooks of 125, 250, 500 and 1000 code cells (without
executing them), against nbconvert's script export of the same notebook in the same process.

Each notebook repeats a block of 10 code cells as real notebooks have them: constants, a function
reading notebook globals, an nn.Module, state, a loop, magics and shell lines, a display-only
cell; every name is distinct, so the analysis has as many definitions as cells. The times
include ruff formatting and the atomic write (not the pdoc HTML, `--no-docs`: it imports the
package, torch included, in about 3 s whatever the size). Goal: 500 cells in under 5 s here, and time
growing linearly with the cell count (the per-cell time should stay flat).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbconvert import ScriptExporter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_trainmate.refactor.pipeline import refactor

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


if __name__ == "__main__":
    found = main()
    sys.exit(0 if found[500] < 5.0 else 1)
