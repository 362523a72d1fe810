"""
The module-level state of the package, in one list, and `reset()` for it.

Modules that keep state for the life of the process: the last run's summary (`last_run()`), the
active session (`jupyter_trainmate.log()`), the rewrite cache, the sweep's current trial
(`suggest()`), the last sweep's summary (`last_sweep()`) and the sweeps' journals kept open
(`sweep/storage.py`). Tests reset it before each test
(tests/conftest.py); a module not imported yet has nothing to reset and is not imported for it.

Not listed on purpose: the fork server of `%%train --procs` (`distributed/forkserver.py`), a
process kept for the kernel's life that tests share; it is started again by itself when the
environment or `sys.path` it was started with changed.
"""

from __future__ import annotations

import sys

STATEFUL = (
    "jupyter_trainmate.runtime.summary",
    "jupyter_trainmate.runtime.session",
    "jupyter_trainmate.rewrite",
    "jupyter_trainmate.sweep.suggest",
    "jupyter_trainmate.sweep.summary",
    "jupyter_trainmate.sweep.storage",
)

# Process-wide state kept on purpose, never reset: one NVML handle per process (no results in
# it), and the fork server of `--procs` (see above).
KEPT = (
    "jupyter_trainmate.monitor.nvml",
    "jupyter_trainmate.distributed.forkserver",
)


def reset() -> None:
    """Forget the last run, the active session and the cached rewrites."""
    for name in STATEFUL:
        module = sys.modules.get(name)
        if module is not None:
            module.reset()
