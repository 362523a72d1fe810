"""
The kind of a failure from its exception type and message alone: ordered rules of regular
expressions, first match wins. No torch import: `trainmate explain` classifies pasted tracebacks
with this module only, and a live exception goes through the same rules (then `explain.build`
adds what its frames hold).

Each rule was written from real messages (tests/data/real_errors.jsonl lists them with their
sources); the order settles messages that mention two things, e.g. a DataLoader worker that
re-raised a `Too many open files` is about open files, and a cuBLAS failure that ran out of
memory (`CUBLAS_STATUS_ALLOC_FAILED`) is about memory.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from .kinds import ErrorKind


@dataclass(frozen=True)
class Rule:
    kind: ErrorKind
    pattern: re.Pattern[str]


def _rule(kind: ErrorKind, *patterns: str) -> Rule:
    return Rule(kind, re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE))


# The input/weight type message names both tensor types: a device difference or a dtype one.
_TYPES = re.compile(r"Input type \(([\w.]+)\) and weight type \(([\w.]+)\)")

RULES: tuple[Rule, ...] = (
    _rule(
        "out_of_memory",
        r"CUDA out of memory",
        r"\bout of memory\b",
        r"OutOfMemoryError",
        r"CUBLAS_STATUS_ALLOC_FAILED",
        r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)",
    ),
    _rule(
        "nan_loss",
        r"non-finite loss",
        r"returned nan values",
        r"\bloss is (?:nan|inf)\b",
    ),
    _rule(
        "too_many_open_files",
        r"Too many open files",
        r"\[Errno 24\]",
        r"\bEMFILE\b",
    ),
    _rule(
        "dataloader_worker",
        r"DataLoader worker \(pid",
        r"bus error",
        r"insufficient shared memory",
        r"unable to write to file </torch_",  # /dev/shm full (see doctor.checks.SHM_MIN_BYTES)
        r"DataLoader timed out after",
    ),
    _rule(
        "device_mismatch",
        r"Expected all tensors to be on the same device",
        r"found at least two devices",
        r"Expected object of device type",
        r"is on \w+(?::\d+)? but expected (?:it )?to be on",
        r"tensors? (?:is|are) on (?:a )?different devices?",
    ),
    _rule(
        "dtype_mismatch",
        r"expected scalar type \w+ but found \w+",
        r"Expected object of scalar type",
        r"Found dtype \w+ but expected \w+",
        r"result type \w+ can't be cast to the desired output type",
        r"must have the same dtype",
        r"expected (?:m1 and m2|both vectors|self and \w+) to have the same dtype",
        r"not implemented for '(?:Half|BFloat16|Int|Long|Byte|Bool|Char|Short)'",
        r"Expected floating point type for target",
        r"expected (?:target )?dtype to be \w+",
        r"should be the same",  # Input type (...) and weight type (...): dtype unless devices differ
    ),
    _rule(
        "index_out_of_range",
        r"index out of range in self",
        r"Target -?\d+ is out of bounds",
        r"device-side assert triggered",
        r"index -?\d+ is out of bounds for dimension",
        r"srcIndex < srcSelectDimSize",
        r"t >= 0 && t < n_classes",
    ),
    _rule(
        "shape_mismatch",
        r"shapes cannot be multiplied",
        r"size of tensor a \(\d+\) must match the size of tensor b",
        r"Expected input batch_size \(\d+\) to match target batch_size",
        r"Expected \d+-dimensional input for \d+-dimensional weight",
        r"to have \d+ channels, but got \d+ channels",
        r"Target size \(.*\) must be the same as input size",
        r"shape '\[[\d, -]*\]' is invalid for input of size",
        r"size mismatch, (?:m1|get)",
        r"The expanded size of the tensor",
        r"Sizes of tensors must match except in dimension",
        r"expected \d+D input \(got \d+D input\)",
        r"Expected (?:input|target) .* shape",
    ),
    _rule(
        "cudnn_cublas",
        r"CUBLAS_STATUS_\w+",
        r"CUDNN_STATUS_\w+",
        r"cuDNN error",
        r"cublas\w*\(",
        r"Unable to find a valid cuDNN algorithm",
    ),
    _rule("inplace_autograd", r"modified by an inplace operation"),
    _rule(
        "backward_twice",
        r"backward through the graph a second time",
        r"access saved tensors after they have already been freed",
    ),
)

# Messages no rule should claim: a state dict that does not fit names shapes, but it is a
# checkpoint problem, not the model's forward pass.
_NOT_OURS = re.compile(r"Error\(s\) in loading state_dict|No module named", re.IGNORECASE)


def classify(exception: str, message: str) -> tuple[ErrorKind, re.Match[str] | None]:
    """The kind of `exception` (its type name, e.g. `RuntimeError`) with `message`, and the match."""
    text = f"{exception}: {message}" if exception else message
    if _NOT_OURS.search(text):
        return "unknown", None
    for rule in RULES:
        match = rule.pattern.search(text)
        if match is None:
            continue
        if rule.kind == "dtype_mismatch" and match.group(0).lower() == "should be the same":
            types = _TYPES.search(text)
            if types is None:
                continue
            if ("cuda" in types.group(1)) != ("cuda" in types.group(2)):
                return "device_mismatch", types
            return "dtype_mismatch", types
        return rule.kind, match
    if "OutOfMemory" in exception or exception.endswith("MemoryError"):
        return "out_of_memory", None
    return "unknown", None


# -- restarts --------------------------------------------------------------------------------------

_TRANSIENT = re.compile(
    "|".join(
        (
            r"uncorrectable ECC error",
            r"ECC error",
            r"unspecified launch failure",
            r"\blaunch failure\b",
            r"Watchdog caught collective operation timeout",
            r"NCCL (?:communicator was aborted|timeout|error: unhandled system error)",
            r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\) (?:is killed by signal|exited unexpectedly)",
            r"DataLoader timed out after",
            r"Input/output error",
            r"Connection reset by peer",
            r"Stale file handle",
        )
    ),
    re.IGNORECASE,
)

TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.ETIMEDOUT, errno.ECONNRESET, errno.ESTALE, errno.EAGAIN, errno.ENETRESET}
)
"""I/O errors on the data that a second attempt may not meet (a network file system, a flaky disk)."""


def transient(exception: str, message: str, error_number: int | None = None) -> bool:
    """Whether a failure is one a restart from the last checkpoint may cure: a GPU fault (an ECC
    error, a launch failure), a collective that timed out, a DataLoader worker that was killed,
    a transient I/O error on the data. A bug in the code (a shape, a dtype, a NaN) is not."""
    if error_number is not None and error_number in TRANSIENT_ERRNOS:
        return True
    if exception in ("TimeoutError", "ConnectionResetError", "BrokenPipeError"):
        return True
    return bool(_TRANSIENT.search(f"{exception}: {message}"))
