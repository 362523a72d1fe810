"""`make lab`: JupyterLab from this checkout's .venv on the bundled notebooks.

It prints the URL with its token (JupyterLab's own banner) and adds `--allow-root` only when
running as root (containers), where JupyterLab refuses to start without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command(root: Path = ROOT / "notebooks", extra: Sequence[str] = ()) -> list[str]:
    """The JupyterLab command line (the browser tests start the lab with it too)."""
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={root}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return [*cmd, *extra]


if __name__ == "__main__":
    print("make lab: JupyterLab on notebooks/ (open the URL below; the sidebar is the chart icon)")
    os.execv(sys.executable, command(extra=sys.argv[1:]))
