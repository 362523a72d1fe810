"""
Step 5: format the files with ruff and put them in place atomically.

Everything is written into a temporary folder beside the output, formatted there (`ruff format`,
then `ruff check --fix` for what it can repair safely, such as an import no longer used), and
renamed into place in one step: an interrupted run leaves nothing half-written, and an existing
folder is replaced only with `--force` (the old one is removed after the new one is in place).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from jupyter_trainmate.errors import TrainmateError


def ruff() -> str:
    from ruff.__main__ import find_ruff_bin  # type: ignore[import-untyped]

    return os.fsdecode(find_ruff_bin())


def format_folder(folder: Path) -> str:
    """Format the Python files under `folder`; return what `ruff check` still reports."""
    binary = ruff()
    common = ["--no-cache", "--quiet"]  # the package's own pyproject.toml says which rules
    subprocess.run([binary, "format", *common, "."], cwd=folder, check=False, capture_output=True)
    subprocess.run(
        [binary, "check", *common, "--fix", "--exit-zero", "."],
        cwd=folder,
        check=False,
        capture_output=True,
    )
    subprocess.run([binary, "format", *common, "."], cwd=folder, check=False, capture_output=True)
    left = subprocess.run(
        [binary, "check", "--no-cache", "--output-format", "concise", "."],
        cwd=folder,
        check=False,
        capture_output=True,
        text=True,
    )
    return left.stdout.strip() if left.returncode else ""


def write_package(
    files: dict[str, str],
    out: Path,
    force: bool,
    finish: Callable[[Path, str], None],
    binary: dict[str, bytes] | None = None,
) -> str:
    """Write `files` to `out` atomically; return ruff's remaining findings ("" when clean).

    `finish(folder, findings)` runs on the formatted files before they move into place (the
    report, the HTML docs).
    """
    if out.exists() and not force:
        raise TrainmateError(f"{out}: exists; add --force to replace it")
    if out.exists() and not out.is_dir():
        raise TrainmateError(f"{out}: exists and is not a folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for relative, text in sorted(files.items()):
            path = tmp / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        for relative, data in sorted((binary or {}).items()):
            path = tmp / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        findings = format_folder(tmp)
        finish(tmp, findings)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            out.replace(old / "previous")
            tmp.replace(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return findings
