"""typecheck calls mypy's build itself (to keep its file-system cache over the rounds): what it
returns must be what `mypy.api.run` returns, round after round, and a module changed between
rounds must be read again; the refactor's garbage-collector setting must not outlive it."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from mypy import api

from jupyter_trainmate.refactor.pipeline import fewer_collections
from jupyter_trainmate.refactor.typecheck import Files, _mypy, run_mypy

GOOD = "def double(x: int) -> int:\n    return x * 2\n"
BAD = 'from .a import double\n\nvalue: str = double(3)\nprint(double("x"))\n'


@pytest.fixture(scope="module")
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.fixture(autouse=True)
def _own_mypy_cache(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This file's mypy runs, and the lock of their cache, use a cache folder of its own: a
    refactor on the other pytest worker holds the shared folder's lock through its rounds, and
    checks packages of other contents in it."""
    from jupyter_trainmate.refactor import typecheck

    monkeypatch.setattr(typecheck, "cache_dir", lambda: str(own_cache / "cache"))


def _package(folder: Path) -> Path:
    """`folder/pkg`: a module that is right (`a`) and one with two errors (`b`)."""
    package = folder / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(GOOD)
    (package / "b.py").write_text(BAD)
    return package


def args(target: Path, cache: Path) -> list[str]:
    return ["--ignore-missing-imports", "--cache-dir", str(cache), "--config-file", os.devnull,
            "--no-error-summary", "--show-error-codes", "--no-pretty", "--hide-error-context",
            "--no-color-output", "--allow-redefinition", "--follow-imports", "silent",
            str(target)]  # fmt: skip


def test_the_same_output_as_mypy_api_run_round_after_round(tmp_path: Path) -> None:
    package = _package(tmp_path)
    files = Files()
    cache = tmp_path / "cache"
    seen = []
    for code in (BAD, "from .a import double\n\nvalue: int = double(3)\n", "def broken(:\n"):
        (package / "b.py").write_text(code)
        files.forget(tmp_path)
        ours = _mypy(args(package, cache), files)
        theirs = api.run(args(package, cache))
        assert ours == theirs
        seen.append(ours)
    assert "[arg-type]" in seen[0][0]
    assert seen[0][2] == 1
    assert (seen[1][0], seen[1][2]) == ("", 0)  # clean (stderr: the empty config file)
    assert ours[2] == 2  # the syntax error blocks, as in mypy's own exit status


def test_a_module_rewritten_between_rounds_is_read_again(tmp_path: Path) -> None:
    package = _package(tmp_path)
    files = Files()
    first = run_mypy(tmp_path, "pkg", files)
    assert not isinstance(first, str)
    assert {(e.module, e.code) for e in first} == {("b", "assignment"), ("b", "arg-type")}
    (package / "b.py").write_text("from .a import double\n\nvalue: int = double(3)\n")
    assert run_mypy(tmp_path, "pkg", files) == []


def test_the_collector_thresholds_come_back(tmp_path: Path) -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with fewer_collections():
            assert gc.get_threshold() == (200_000, 30, 30)
            gc.set_threshold(5, 5, 5)  # as mypy does inside the refactor
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


def test_a_mypy_whose_internals_moved_still_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_trainmate.refactor import typecheck

    def moved(args: list[str], files: Files) -> tuple[str, str, int]:
        raise TypeError("build() got an unexpected keyword argument")

    monkeypatch.setattr(typecheck, "_mypy", moved)
    _package(tmp_path)
    errors = run_mypy(tmp_path, "pkg")
    assert not isinstance(errors, str)
    assert {(e.module, e.code) for e in errors} == {("b", "assignment"), ("b", "arg-type")}


def test_one_refactor_at_a_time_on_the_shared_mypy_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from filelock import FileLock, Timeout

    from jupyter_trainmate.refactor import typecheck

    held: list[bool] = []

    def rounds(
        folder: Path, package: str, files: Files | None = None, collect: object = None
    ) -> list[object]:
        try:  # another refactor's attempt to start its rounds now
            FileLock(typecheck.cache_dir() + ".lock", timeout=0).acquire()
        except Timeout:
            held.append(True)
        else:
            held.append(False)
        return []

    monkeypatch.setattr(typecheck, "run_mypy", rounds)
    checked = typecheck.check({"pkg/__init__.py": "", "pkg/a.py": GOOD}, "pkg", {})
    assert checked.result == "clean"
    assert held == [True]  # the cache was locked through the round
    FileLock(typecheck.cache_dir() + ".lock", timeout=0).acquire()  # and is free after


def test_an_internal_mypy_error_is_a_line_not_an_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mypy import build

    def crashes(*args: object, **kwargs: object) -> None:
        raise SystemExit(2)  # how mypy's report_internal_error ends

    monkeypatch.setattr(build, "build", crashes)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    assert run_mypy(tmp_path, "pkg").startswith("not run: mypy failed")  # type: ignore[union-attr]


def test_a_module_rewritten_to_the_same_size_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_trainmate.refactor import rejected, typecheck

    # mypy trusts its cache when a module's size and time in whole seconds are unchanged: the
    # check gives each round's rewritten modules a later whole second
    same_size = ('x: int = "a"\n', 'x: str = "a"\n')
    assert len(same_size[0]) == len(same_size[1])
    times: list[int] = []
    answers = iter([[rejected.Error("a", 1, "Incompatible types", "assignment")], []])

    def rounds(
        folder: Path, package: str, files: Files | None = None, collect: object = None
    ) -> object:
        times.append(int((folder / package / "a.py").stat().st_mtime))
        return next(answers)

    monkeypatch.setattr(typecheck, "run_mypy", rounds)
    monkeypatch.setattr(typecheck, "_plan_edits", lambda *args: {"a": ({}, set())})
    monkeypatch.setattr(typecheck, "_edited", lambda code, drop, decorate: same_size[1])
    files = {"pkg/__init__.py": "", "pkg/a.py": same_size[0]}
    assert typecheck.check(files, "pkg", {}).result == "clean"
    assert len(times) == 2
    assert times[1] > times[0]


def test_the_collector_is_on_again_after_a_refactor() -> None:
    before = gc.isenabled()
    try:
        gc.enable()
        with fewer_collections():
            gc.disable()  # mypy's load_graph, left off by an error inside it
        assert gc.isenabled()
    finally:
        (gc.enable if before else gc.disable)()
