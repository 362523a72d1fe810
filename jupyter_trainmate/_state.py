"""
The module-level state of the package, in one list, and `reset()` for it.

Three modules keep state for the life of the process: the last run's summary (`last_run()`), the
active session (`jupyter_trainmate.log()`) and the rewrite cache. Tests reset it before each test
(tests/conftest.py); a module not imported yet has nothing to reset and is not imported for it.
"""

from __future__ import annotations

import sys

STATEFUL = (
    "jupyter_trainmate.runtime.summary",
    "jupyter_trainmate.runtime.session",
    "jupyter_trainmate.rewrite",
)


def reset() -> None:
    """Forget the last run, the active session and the cached rewrites."""
    for name in STATEFUL:
        module = sys.modules.get(name)
        if module is not None:
            module.reset()
