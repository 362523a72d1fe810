"""Run every benchmark in this folder; copy the figures into BENCHMARKS.md with the date."""

from __future__ import annotations

import contextlib
import runpy
import sys
from pathlib import Path

for script in sorted(Path(__file__).parent.glob("*.py")):
    if script.name != "run_all.py":
        print(f"== {script.name}", flush=True)
        sys.argv = [str(script)]
        with contextlib.suppress(SystemExit):
            runpy.run_path(str(script), run_name="__main__")
