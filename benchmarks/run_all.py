"""Run every benchmark in this folder; copy the figures into BENCHMARKS.md by hand with the date."""

from __future__ import annotations

import runpy
from pathlib import Path

for script in sorted(Path(__file__).parent.glob("*.py")):
    if script.name != "run_all.py":
        print(f"== {script.name}")
        runpy.run_path(str(script), run_name="__main__")
