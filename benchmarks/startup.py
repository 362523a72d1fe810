"""Start-up cost of jupyter_trainmate, as ratios against a baseline run in the same script.

- load_ext: an IPython shell that runs `%load_ext jupyter_trainmate`, against the same shell
  without it. The extension should add close to nothing to a kernel's start (no torch import).
- doctor: `trainmate doctor` (every check but --data), against `python -c "import torch"`, which
  every doctor run pays anyway: the ratio is the cost of the checks themselves.

Runs alternate between the measured command and its baseline so machine noise hits both alike;
the figure is the ratio of medians.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

SHELL = (
    "from IPython.core.interactiveshell import InteractiveShell; sh = InteractiveShell.instance()"
)
PAIRS = {
    "load_ext": (
        [sys.executable, "-c", SHELL + "; sh.run_line_magic('load_ext', 'jupyter_trainmate')"],
        [sys.executable, "-c", SHELL],
    ),
    "doctor": (
        [sys.executable, "-m", "jupyter_trainmate", "doctor"],
        [sys.executable, "-c", "import torch"],
    ),
}


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - started


def measure(name: str, repeats: int) -> dict[str, float]:
    measured, baseline = PAIRS[name]
    timed(measured), timed(baseline)  # warm the page cache
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(measured))
        b.append(timed(baseline))
    ma, mb = statistics.median(a), statistics.median(b)
    return {"measured_s": ma, "baseline_s": mb, "ratio": ma / mb}


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    for name in PAIRS:
        r = measure(name, repeats)
        print(
            f"{name:9s} median {r['measured_s'] * 1000:7.0f} ms vs baseline "
            f"{r['baseline_s'] * 1000:7.0f} ms: ratio {r['ratio']:.2f} (n={repeats})"
        )


if __name__ == "__main__":
    main()
