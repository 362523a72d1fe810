"""Explanations of live exceptions (with their frames) and of traceback text (message only)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Container, Mapping
from typing import Any

from .classify import classify, transient
from .kinds import ErrorKind, Explanation


def _type_name(exc: BaseException) -> str:
    return type(exc).__name__


def _message(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, OSError) and exc.errno is not None and f"[Errno {exc.errno}]" not in text:
        text = f"[Errno {exc.errno}] {text}"
    return text


def _chain(exc: BaseException) -> str:
    """The messages of the exceptions `exc` was raised from (a DataLoader re-raises a worker's
    `killed by signal` as `exited unexpectedly`)."""
    found: list[str] = []
    seen = {id(exc)}
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen and len(found) < 5:
        seen.add(id(cause))
        found.append(f"{_type_name(cause)}: {_message(cause)}")
        cause = cause.__cause__ or cause.__context__
    return "\n".join(found)


def kind_of(exc: BaseException) -> ErrorKind:
    """The kind of a live exception: its type first (the real exception types), then the rules."""
    import torch

    from ..errors import NanDetected

    if isinstance(exc, torch.OutOfMemoryError):
        return "out_of_memory"
    if isinstance(exc, NanDetected):
        return "nan_loss"
    if isinstance(exc, OSError) and exc.errno == 24:
        return "too_many_open_files"
    return classify(_type_name(exc), _message(exc))[0]


def restartable(exc: BaseException) -> bool:
    """Whether `%%train --retries` should restart the run from its last checkpoint after `exc`:
    a failure of the machine or the data path, not of the code (see `classify.transient`)."""
    from ..errors import TrainmateError

    if isinstance(exc, (TrainmateError, KeyboardInterrupt)) or not isinstance(exc, Exception):
        return False
    number = exc.errno if isinstance(exc, OSError) else None
    return transient(_type_name(exc), _message(exc), number)


def _extra(
    kind: ErrorKind, message: str, namespace: Mapping[str, Any] | None, amp: str
) -> dict[str, Any]:
    """Measured context for the builders: memory figures, /dev/shm, the open-file limit."""
    extra: dict[str, Any] = {"amp": amp}
    if kind == "out_of_memory":
        from .memory import breakdown

        extra["memory"] = breakdown(message, namespace)
    elif kind == "dataloader_worker":
        with contextlib.suppress(OSError):
            st = os.statvfs("/dev/shm")  # what `trainmate doctor` measures
            extra["shm_bytes"] = st.f_frsize * st.f_blocks
    elif kind == "too_many_open_files":
        with contextlib.suppress(ImportError, OSError, ValueError):
            import resource

            extra["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)
    elif kind == "nan_loss":
        import torch

        for name, value in (namespace or {}).items():
            if not name.startswith("_") and isinstance(value, torch.optim.Optimizer):
                extra["lr"] = float(value.param_groups[0].get("lr", 0.0))
                break
    elif kind == "cudnn_cublas":
        import torch

        extra["versions"] = (
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()}"  # type: ignore[no-untyped-call]
        )
    return extra


def explain(
    exc: BaseException,
    namespace: Mapping[str, Any] | None = None,
    user_files: Container[str] = (),
    amp: str = "",
    retries: tuple[int, int] = (0, 0),
) -> Explanation:
    """Explain a live exception: its kind, and the real values from the failing frames.

    `namespace` holds the notebook's models, optimizers and loaders (layer names, memory held);
    `user_files` the file names of the user's code (the cell as IPython registered it);
    `retries`: the run's restarts so far and those left under `--retries` (the restart advice
    says a restart comes, or that they were used up).
    """
    from .advice import BUILDERS
    from .facts import gather

    kind = kind_of(exc)
    message = _message(exc)
    facts = gather(exc, namespace, user_files)
    extra = _extra(kind, message, namespace, amp)
    extra["restartable"] = can_restart = restartable(exc)
    extra["retries"] = retries
    extra["chain"] = _chain(exc)
    what, cause, advice = BUILDERS[kind](message, facts, extra)
    return Explanation(kind, what, cause, advice, can_restart)


def explain_message(exception: str, message: str, chain: str = "") -> Explanation:
    """Explain an exception known only by its type name and message (a pasted traceback);
    `chain` is the text around it (the exceptions it was raised from)."""
    from .advice import BUILDERS
    from .facts import Facts

    kind = classify(exception, message)[0]
    can_restart = transient(exception, message)
    extra: dict[str, Any] = {"restartable": can_restart, "chain": chain}
    if kind == "out_of_memory":
        from .memory import from_message

        extra["memory"] = from_message(message)
    what, cause, advice = BUILDERS[kind](message, Facts(), extra)
    return Explanation(kind, what.split(" at line ")[0], cause, advice, can_restart)
