"""
Explained errors: when a `%%train` cell raises, what happened, the likely cause with the real
values from the failing frames, and the fixes, most likely first, with the `%%train` option that
applies. Rules over the exception's type, its message and the frames' locals; no network, no
model.

- `kinds`: `ErrorKind` (the public names) and the frozen `Explanation`.
- `classify`: the kind from type name and message alone, and `transient` (restartable).
- `facts`: the user's innermost frame and the library call under it (tensors, layer, loader).
- `memory`: out-of-memory figures; `advice`: message, cause and fixes per kind.
- `build`: `explain(exc)` for a live exception, `explain_message(type, message)` for text.
- `traceback_text`: the exception of a pasted traceback (`trainmate explain`).
"""

from __future__ import annotations

from .kinds import KINDS, ErrorKind, Explanation

__all__ = ["KINDS", "ErrorKind", "Explanation"]
