"""
Memory figures for an out-of-memory explanation: what the allocator says (free and total memory
of the GPU, allocated, reserved), and how much of it the notebook's training objects hold
(parameters, gradients, optimizer state); activations are the rest of what is allocated, the
cache what is reserved and not allocated. Figures from the message itself when there is no GPU
to ask (a pasted traceback, a test on the CPU).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

GiB = 1024**3
MiB = 1024**2

_UNITS = {"B": 1, "bytes": 1, "KiB": 1024, "MiB": MiB, "GiB": GiB, "TiB": 1024 * GiB}
_AMOUNT = r"([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)"
_FIELDS = {
    "requested": rf"Tried to allocate {_AMOUNT}",
    "total": rf"total capac(?:i)?ty (?:of )?{_AMOUNT}|{_AMOUNT} total capacity",
    "free": rf"of which {_AMOUNT} is free|{_AMOUNT} free",
    "allocated": rf"{_AMOUNT} is allocated by PyTorch|{_AMOUNT} already allocated",
}


def size(n: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def from_message(message: str) -> dict[str, int]:
    """The figures an out-of-memory message states (`Tried to allocate 2.00 GiB`, ...)."""
    found = {}
    for key, pattern in _FIELDS.items():
        match = re.search(pattern, message)
        if match:
            number, unit = [g for g in match.groups() if g is not None][:2]
            found[key] = int(float(number) * _UNITS[unit])
    return found


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def held_by_objects(namespace: Mapping[str, Any] | None) -> dict[str, int]:
    """Parameters, gradients and optimizer state of the notebook's models and optimizers."""
    params: dict[int, torch.Tensor] = {}
    state = 0
    for name, value in (namespace or {}).items():
        if name.startswith("_"):
            continue
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                params[id(p)] = p
        elif isinstance(value, torch.optim.Optimizer):
            for per_param in value.state.values():
                state += _bytes(per_param.values())
    return {
        "parameters": _bytes(params.values()),
        "gradients": _bytes(p.grad for p in params.values() if p.grad is not None),
        "optimizer state": state,
    }


def measured(device: torch.device | None = None) -> dict[str, int]:
    """Free and total memory of the GPU and the allocator's counts, when CUDA is there."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return {}
    try:
        free, total = torch.cuda.mem_get_info(device)
        return {
            "free": free,
            "total": total,
            "allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
        }
    except RuntimeError:  # a broken context (after a device-side assert): no figures
        return {}


def breakdown(message: str, namespace: Mapping[str, Any] | None) -> dict[str, int]:
    """Every figure known: the message's, the allocator's (they win), the objects', and the
    activations and cache they imply."""
    figures = from_message(message)
    figures.update(measured())
    objects = held_by_objects(namespace)
    figures.update(objects)
    if "allocated" in figures:
        figures["activations"] = max(0, figures["allocated"] - sum(objects.values()))
    if "reserved" in figures and "allocated" in figures:
        figures["cache"] = max(0, figures["reserved"] - figures["allocated"])
    return figures
