"""Run the `trainmate` command as a user does: `python -m jupyter_trainmate ARGS`, in a child
process (its exit status, stdout and stderr for the tests to read)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def trainmate(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_trainmate", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )
