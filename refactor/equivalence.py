"""
`--check-equivalence` (with `--execute`): does the package compute what the notebook computed?

The notebook has run (see `trace`) and left its numbers behind: every variable holding a number,
a one-element tensor or a short list of numbers. The package's `run(Config())` then runs in a
fresh folder with the notebook's own hyperparameters (and so its own seeds), in a separate
process, and returns its variables; the numbers both have under the same name are compared
within a relative tolerance. Both processes start from the same state of the random number
generators (`SEED`, before the notebook's first cell and before `run()`) and the same string
hashing (`HASH_SEED`): a notebook that never seeds, or that builds a vocabulary from a `set`,
draws the same numbers in the same order in both, so its numbers can be compared at all. Bit-identical is the usual outcome on a CPU: the package runs the
notebook's code in the notebook's order, and a `%%train` cell runs on the same runtime.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run first in the notebook's kernel and before the package's run(): a notebook that seeds
# itself overrides it, one that does not draws the same numbers in both.
SEED = """
def __trainmate_seed__():
    import random
    random.seed(0)
    for module, call in (("numpy", "random.seed"), ("torch", "manual_seed")):
        try:
            target = __import__(module)
        except ImportError:
            continue
        for part in call.split("."):
            target = getattr(target, part)
        target(0)
__trainmate_seed__()
del __trainmate_seed__
"""
HASH_SEED = "0"  # PYTHONHASHSEED of both processes: the order of a set of strings

RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[1])
exec(sys.argv[4])  # SEED: before the package's imports, as before the notebook's first cell
import importlib
run = importlib.import_module(sys.argv[2] + ".train").run
Config = importlib.import_module(sys.argv[2] + ".config").Config
state = run(Config())
numbers = {}
for name, v in state.items():
    try:
        import torch
        if isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point():
            v = v.item()
    except ImportError:
        pass
    if isinstance(v, bool):
        continue
    if isinstance(v, (int, float)):
        numbers[name] = float(v)
    elif isinstance(v, (list, tuple)) and 0 < len(v) <= 50:
        flat = [x for i in v for x in (i if isinstance(i, (list, tuple)) else (i,))]
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in flat):
            numbers[name] = [float(x) for x in flat]
with open(sys.argv[3], "w") as f:
    json.dump(numbers, f)
"""


@dataclass
class Equivalence:
    compared: list[tuple[str, str, str, bool]] = field(default_factory=list)  # name, nb, pkg, ok
    error: str = ""
    tolerance: float = 1e-4

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.compared) and all(ok for *_, ok in self.compared)


def _close(a: Any, b: Any, tolerance: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance * 1e-3)
    return False


def check(
    folder: Path,
    package: str,
    notebook: dict[str, Any],
    skip: set[str] | frozenset[str] = frozenset(),
    tolerance: float = 1e-4,
    source: Path | None = None,
) -> Equivalence:
    """Run the package in `folder` and compare its numbers with the notebook's (not `skip`:
    the hyperparameters, equal by construction). `source`: the notebook, whose neighbouring
    files (its data) the run's fresh folder gets a copy of, as the notebook's run did."""
    from .workdir import stage

    out = Equivalence(tolerance=tolerance)
    with tempfile.TemporaryDirectory(prefix="trainmate-equivalence-") as tmp:
        if source is not None:
            stage(source, Path(tmp))
        result = Path(tmp) / "__trainmate_numbers__.json"
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER, str(folder.resolve()), package, str(result), SEED],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": HASH_SEED},
        )
        if proc.returncode:
            last = (proc.stderr.strip().splitlines() or ["it failed"])[-1]
            out.error = f"the package's run() failed: {last[:200]}"
            return out
        package_numbers = json.loads(result.read_text())
    for name in sorted((notebook.keys() & package_numbers.keys()) - set(skip)):
        a, b = notebook[name], package_numbers[name]
        out.compared.append((name, _short(a), _short(b), _close(a, b, tolerance)))
    if not out.compared:
        out.error = "no number has the same name in the notebook and the package"
    return out


def _short(value: Any) -> str:
    if isinstance(value, list):
        head = ", ".join(f"{v:.6g}" for v in value[:4])
        return f"[{head}{', ...' if len(value) > 4 else ''}] ({len(value)})"
    return f"{value:.6g}"
