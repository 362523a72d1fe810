"""
Step 5: format the files with ruff and put them in place atomically.

Everything is written into a temporary folder beside the output, formatted there (`ruff format`,
then `ruff check --fix` for what it can repair safely, such as an import no longer used), and
renamed into place in one step: an interrupted run leaves nothing half-written. Into an existing
folder (only with `--force`) each file is moved over the one an earlier refactor wrote, and only
those: the rules are in `jupyter_trainmate.refactor.manifest`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import manifest


def ruff() -> str:
    from ruff.__main__ import find_ruff_bin  # type: ignore[import-untyped]

    return os.fsdecode(find_ruff_bin())


def format_folder(folder: Path) -> str:
    """Format the Python files under `folder`; return what `ruff check` still reports."""
    binary = ruff()
    common = ["--no-cache", "--quiet"]  # the package's own pyproject.toml says which rules
    subprocess.run([binary, "format", *common, "."], cwd=folder, check=False, capture_output=True)
    subprocess.run(
        # and an `if TYPE_CHECKING:` block left empty (TC005), with the import of the flag
        [binary, "check", *common, "--fix", "--extend-select", "TC005", "--exit-zero", "."],
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
    if left.returncode not in (0, 1):  # ruff itself failed (a pyproject.toml it cannot read)
        why = (left.stderr.strip().splitlines() or [f"exit {left.returncode}"])[0]
        return f"ruff did not run: {why}"
    return left.stdout.strip() if left.returncode else ""


def write_package(
    notebook: Path,
    files: dict[str, str],
    out: Path,
    force: bool,
    finish: Callable[[Path, str], None],
    binary: dict[str, bytes] | None = None,
) -> str:
    """Write `files` to `out` with the manifest; return ruff's remaining findings ("" when clean).

    `finish(folder, findings)` runs on the formatted files before they move into place (the
    report, the HTML docs). A new folder is staged beside `out` and renamed into place; into an
    existing one (`--force`, see `jupyter_trainmate.refactor.manifest`) the files are staged inside it and each
    moved over its old version in one step, then the files of the earlier run that the new one
    does not write are removed: nothing else in the folder is touched.
    """
    manifest.check(notebook, out, force)
    exists = out.exists()
    if exists:
        tmp = Path(tempfile.mkdtemp(prefix=manifest.STAGING, dir=out))
    else:
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
        written = {
            p.relative_to(tmp).as_posix(): manifest.sha256(p)
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        (tmp / manifest.NAME).write_text(manifest.dump(notebook, written), encoding="utf-8")
        if exists:
            _update(notebook, tmp, out, written, force)
        else:
            tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return findings


def _update(notebook: Path, tmp: Path, out: Path, written: dict[str, str], force: bool) -> None:
    """Move the staged files over an earlier refactor's in `out`, touching nothing else."""
    previous = manifest.check(notebook, out, force)  # again: the user may have edited meanwhile
    manifest.in_the_way(out, previous, written)
    old = dict(previous.files) if previous is not None else {}
    pending = tmp / f"{manifest.NAME}.pending"
    pending.write_text(manifest.dump(notebook, old, written), encoding="utf-8")
    manifest.replace_file(pending, out / manifest.NAME)
    for relative in sorted(written):
        manifest.replace_file(tmp / relative, out / relative)
    for relative in sorted(set(old) - set(written)):
        path = out / relative
        if path.is_file():
            path.unlink()
            manifest.prune(out, relative)
    manifest.replace_file(tmp / manifest.NAME, out / manifest.NAME)
