"""`runtime.files.write_atomically`: the whole file or the old one, its folder made, its mode."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import BinaryIO

import pytest

from jupyter_trainmate.runtime import files
from jupyter_trainmate.runtime.files import write_atomically, write_text_atomically


def test_a_new_file_in_missing_folders_gets_the_usual_mode_and_no_temporary_is_left(
    tmp_path: Path,
) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "a" / "b" / "status.json"
    write_text_atomically(path, "one")
    assert path.read_text() == "one"
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    write_text_atomically(path, "two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["status.json"]


def test_a_replaced_file_keeps_its_mode_and_a_durable_write_lands(tmp_path: Path) -> None:
    path = tmp_path / "table.md"
    path.write_text("old")
    path.chmod(0o640)
    write_atomically(path, lambda f: f.write(b"new"), durable=True)
    assert path.read_bytes() == b"new"
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")

    def fail(f: BinaryIO) -> None:
        f.write(b"half")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        write_atomically(path, fail)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_a_taken_temporary_name_is_skipped_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    numbers = iter([7, 7, 8])
    monkeypatch.setattr(files, "_NUMBERS", numbers)
    path = tmp_path / "x.json"
    write_text_atomically(path, "first")  # its temporary name ends in -7
    taken = tmp_path / f".x.json.{os.getpid()}-{threading.get_ident()}-7.tmp"
    taken.write_text("someone else's")
    write_text_atomically(path, "second")  # -7 is taken: -8
    assert path.read_text() == "second"
    assert taken.read_text() == "someone else's"
