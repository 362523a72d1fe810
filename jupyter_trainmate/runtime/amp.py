"""
Mixed precision policy: which autocast dtype, and whether a GradScaler is needed.

`--amp auto` picks bf16 autocast on GPUs that support it (compute capability 8.0 and newer), fp16
autocast with a GradScaler on older GPUs, and nothing on the CPU: bf16 autocast on a CPU is slower
than fp32 for the small ops of typical notebook models on these machines. `--amp bf16` or
`--amp fp16` (with a GradScaler, as on a GPU) still force it there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import TrainmateError
from .options import AMP_MODES


@dataclass(frozen=True)
class AmpPolicy:
    """The resolved mixed precision settings of a run."""

    mode: Literal["bf16", "fp16", "off"]
    device_type: str
    reason: str

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mode)

    @property
    def needs_scaler(self) -> bool:
        """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
        return self.mode == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """Autocast for a whole cell, without autocast's weight-cast cache.

        The cache keeps the low-precision copy of each parameter until the outermost autocast
        region exits: per-step regions (the usual recipe) drop it every step, but a region held
        over the whole cell would reuse the weights of the first step forever, so the model would
        stop learning. Clearing it after optimizer steps is not enough either (weight clipping,
        EMA updates, LBFGS closures change weights between steps). Without the cache a weight
        used twice in one forward (an unrolled RNN) is cast twice; the values are the same.
        """
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, cache_enabled=False)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type) if self.needs_scaler else None


def resolve_amp(mode: str, device: torch.device, reads_gradients: str | None = None) -> AmpPolicy:
    """Turn `--amp MODE` into a policy for `device`; a mode the device cannot run is an error.

    `reads_gradients` names code that reads gradients where they cannot be unscaled first (a
    `p.grad` read, a clipping function the rewrite does not know): a GradScaler would hand it
    scaled gradients (clipping them at a norm thousands of times too large), so fp16 is refused.
    """
    policy = _resolve_amp(mode, device)
    if policy.needs_scaler and reads_gradients is not None:
        if mode == "fp16":
            raise TrainmateError(
                f"--amp fp16: {reads_gradients} reads gradients a GradScaler would leave scaled; "
                "use --amp bf16 or --amp off"
            )
        return AmpPolicy(
            "off", policy.device_type, f"auto: fp16 would scale what {reads_gradients} reads"
        )
    return policy


def _resolve_amp(mode: str, device: torch.device) -> AmpPolicy:
    if mode not in AMP_MODES:
        raise TrainmateError(f"--amp {mode}: choose one of {', '.join(AMP_MODES)}")
    kind = device.type
    if mode == "off":
        return AmpPolicy("off", kind, "--amp off")
    if kind == "cuda":
        bf16_ok = torch.cuda.get_device_capability(device) >= (8, 0)
        if mode == "auto":
            if bf16_ok:
                return AmpPolicy("bf16", kind, "auto: the GPU supports bf16")
            return AmpPolicy("fp16", kind, "auto: no bf16 on this GPU, fp16 with a GradScaler")
        if mode == "bf16" and not bf16_ok:
            raise TrainmateError(f"--amp bf16: {torch.cuda.get_device_name(device)} has no bf16")
        return AmpPolicy(mode, kind, f"--amp {mode}")
    if mode == "auto":
        return AmpPolicy("off", kind, f"auto: off on {kind} (bf16 autocast is slower there)")
    return AmpPolicy(mode, kind, f"--amp {mode}")
