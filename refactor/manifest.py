"""
What the refactor may write where: the output folder's manifest and the checks made before writing.

Every run writes `.trainmate-refactor.json` into the output folder: the relative path and SHA-256
of each file it wrote, the notebook's name and hash, and the jupyter_trainmate version. The rules:

- the output folder may not hold the notebook (the default, the notebook's name without
  `.ipynb` beside it, never does): refused with or without `--force`;
- an existing folder is refused without `--force`;
- with `--force`, the folder must be empty or hold a manifest; then only the files the manifest
  lists are replaced (or removed when the new package no longer has them), each only while it
  still holds what the refactor wrote: a file edited since is refused, as is a file of the user's
  where the new package would put one of its own. Every other file is left alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from jupyter_trainmate._version import __version__
from jupyter_trainmate.errors import TrainmateError

NAME = ".trainmate-refactor.json"
STAGING = ".trainmate-refactor-tmp."  # prefix of the temporary folders the refactor stages files in


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """The files an earlier refactor wrote in a folder: relative path -> SHA-256.

    `pending` holds the hashes of a write in progress: a run that stopped half-way leaves files
    with either hash, and both are the refactor's own.
    """

    files: Mapping[str, str]
    pending: Mapping[str, str]

    def ours(self, relative: str, digest: str) -> bool:
        return digest in (self.files.get(relative), self.pending.get(relative))


def dump(notebook: Path, files: Mapping[str, str], pending: Mapping[str, str] | None = None) -> str:
    data: dict[str, object] = {
        "written_by": f"jupyter_trainmate {__version__} (trainmate refactor)",
        "notebook": {"name": notebook.name, "sha256": sha256(notebook)},
        "files": dict(sorted(files.items())),
    }
    if pending:
        data["pending"] = dict(sorted(pending.items()))
    return json.dumps(data, indent=1) + "\n"


def load(out: Path) -> Manifest | None:
    """The manifest in `out`, None when there is none; a damaged one is a one-line error."""
    path = out / NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        maps = [data.get(key) or {} for key in ("files", "pending")]
        if not all(isinstance(m, dict) for m in maps):
            raise ValueError("no files table")
        for relative, digest in (item for m in maps for item in m.items()):
            parts = Path(relative).parts
            if Path(relative).is_absolute() or ".." in parts or not isinstance(digest, str):
                raise ValueError(f"bad entry {relative!r}")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise TrainmateError(
            f"{path}: not a manifest trainmate refactor can read ({exc}); "
            "choose a new folder with -o"
        ) from None
    return Manifest(maps[0], maps[1])


def holds(folder: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def check(notebook: Path, out: Path, force: bool) -> Manifest | None:
    """Refuse an output folder the refactor may not write into; return its manifest, if any.

    Called before any work is done, and again just before writing (with the files to write).
    """
    if holds(out, notebook):
        raise TrainmateError(
            f"{out}: holds the notebook {notebook.name}; the package would be mixed with your "
            f"files: choose a new folder with -o (the default is {notebook.with_suffix('').name}/ "
            "beside the notebook)"
        )
    if not out.exists():
        return None
    if not out.is_dir():
        raise TrainmateError(f"{out}: exists and is not a folder")
    if not force:
        raise TrainmateError(
            f"{out}: exists; add --force to replace the files an earlier refactor wrote there"
        )
    manifest = load(out)
    if manifest is None:
        other = sorted(p.name for p in out.iterdir() if not p.name.startswith(STAGING))
        if other:
            raise TrainmateError(
                f"{out}: holds files trainmate refactor did not write ({other[0]}"
                f"{f' and {len(other) - 1} more' if len(other) > 1 else ''}); "
                "--force replaces only what a refactor wrote: choose a new or empty folder with -o"
            )
        return None
    for relative in sorted(manifest.files):
        path = out / relative
        if path.is_file() and not manifest.ours(relative, sha256(path)):
            raise TrainmateError(
                f"{path}: changed since trainmate refactor wrote it; --force never replaces "
                "your edits: move the file away (or delete it) and run again"
            )
    return manifest


def in_the_way(out: Path, manifest: Manifest | None, new: Iterable[str]) -> None:
    """Refuse when a file the package needs would replace one the refactor did not write."""
    for relative in sorted(new):
        path = out / relative
        mine = manifest is not None and relative in manifest.files
        if path.is_dir() or (path.exists() and not mine) or _blocked(out, relative):
            raise TrainmateError(
                f"{path}: a file of yours is where the package puts {relative}; "
                "move it away or choose a new folder with -o"
            )


def _blocked(out: Path, relative: str) -> bool:
    """A parent of `relative` exists in `out` as something other than a folder."""
    parents = list(Path(relative).parents)[:-1]  # the last one is "." (out itself)
    return any((out / p).exists() and not (out / p).is_dir() for p in parents)


def prune(out: Path, relative: str) -> None:
    """Remove the folders that removing `relative` left empty, up to `out`."""
    folder = (out / relative).parent
    while folder.resolve() != out.resolve() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def replace_file(source: Path, target: Path) -> None:
    """Move `source` over `target` in one step (both in the same file system)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    source.replace(target)
