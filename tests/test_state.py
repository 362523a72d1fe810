"""Module-level state is reset between tests, and `_state` names every module that keeps some."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import jupyter_trainmate
from jupyter_trainmate import _state, last_run
from jupyter_trainmate.rewrite import rewrite_cell
from jupyter_trainmate.runtime import session, summary

PACKAGE = Path(jupyter_trainmate.__file__).parent


def test_reset_forgets_the_last_run_the_active_session_and_cached_rewrites() -> None:
    import jupyter_trainmate.rewrite as rewrite

    summary.remember_last_run(object())  # type: ignore[arg-type]
    session._active = object()  # type: ignore[assignment]
    rewrite_cell("for xb in loader:\n    pass\n", {"loader": []})
    assert last_run() is not None
    assert rewrite._CACHE
    _state.reset()
    assert last_run() is None
    assert session._active is None
    assert not rewrite._CACHE


def test_every_module_with_global_state_is_reset() -> None:
    """A module that rebinds a global (`global x`) keeps state: `_state` must list it, and it
    must have a `reset()`."""
    stateful = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.Global) for node in ast.walk(tree)):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            stateful.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    # caches that are mutated dicts, not rebound names: the rewrites, the sweeps' kept journals
    stateful |= {"jupyter_trainmate.rewrite", "jupyter_trainmate.sweep.storage"}
    stateful -= set(_state.KEPT)  # kept for the process's life on purpose (`_state.KEPT`)
    assert stateful == set(_state.STATEFUL)
    for name in stateful:
        assert callable(importlib.import_module(name).reset)
