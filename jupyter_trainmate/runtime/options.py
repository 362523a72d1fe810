"""The options of one `%%train` run, checked once, shared by the magic and the session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import TrainmateError
from .amp import AMP_MODES

PrefetchMode = Literal["auto", "off", "cuda", "thread"]
PREFETCH_MODES: tuple[PrefetchMode, ...] = ("auto", "off", "cuda", "thread")
DISPLAY_MODES = ("auto", "widget", "text", "off")


@dataclass(frozen=True)
class TrainOptions:
    """`%%train [--amp] [--device] [--accumulate] [--clip] [--prefetch] [--display] [--show]`."""

    amp: str = "auto"
    device: str = "auto"
    accumulate: int = 1
    clip: float | None = None
    prefetch: str = "auto"
    show: bool = False
    display: str = "auto"
    tune_loader: int = 0  # batches per candidate setting; 0: off
    checkpoint: str | None = None  # folder; None: no checkpoints
    every: int = 0  # steps between checkpoints; 0: at epoch ends (and on interrupt/error) only
    keep: int = 3
    resume: bool = False
    set: tuple[str, ...] = ()  # "lr=3e-4": optimizer hyperparameters changed after --resume
    on_nan: str = "off"  # off | stop | skip | rollback
    on_spike: str = "off"  # off | warn | skip | rollback
    spike_factor: float = 10.0
    patience: int | None = None
    monitor: str | None = None
    mode: str = "min"
    tensorboard: str = "auto"  # auto: event files when the tensorboard package is installed

    def __post_init__(self) -> None:
        if self.amp not in AMP_MODES:
            raise TrainmateError(f"--amp {self.amp}: choose one of {', '.join(AMP_MODES)}")
        if self.prefetch not in PREFETCH_MODES:
            raise TrainmateError(
                f"--prefetch {self.prefetch}: choose one of {', '.join(PREFETCH_MODES)}"
            )
        if self.display not in DISPLAY_MODES:
            raise TrainmateError(
                f"--display {self.display}: choose one of {', '.join(DISPLAY_MODES)}"
            )
        if self.tune_loader < 0:
            raise TrainmateError(
                f"--tune-loader {self.tune_loader}: batches per setting, 1 or more"
            )
        if self.every < 0 or self.keep < 1:
            raise TrainmateError(
                f"--every {self.every} --keep {self.keep}: need every >= 0, keep >= 1"
            )
        if (self.every or self.resume) and self.checkpoint is None:
            raise TrainmateError("--every/--resume need --checkpoint DIR")
        for item in self.set:
            name, eq, value = item.partition("=")
            if not eq or not name.isidentifier():
                raise TrainmateError(f"--set {item}: write NAME=VALUE, e.g. --set lr=3e-4")
            try:
                float(value)
            except ValueError:
                raise TrainmateError(f"--set {item}: {value!r} is not a number") from None
        if self.set and not self.resume:
            raise TrainmateError("--set changes hyperparameters of a resumed run: add --resume")
        if self.on_nan not in ("off", "stop", "skip", "rollback"):
            raise TrainmateError(f"--on-nan {self.on_nan}: choose one of off, stop, skip, rollback")
        if self.on_spike not in ("off", "warn", "skip", "rollback"):
            raise TrainmateError(
                f"--on-spike {self.on_spike}: choose one of off, warn, skip, rollback"
            )
        if not self.spike_factor > 1:
            raise TrainmateError(f"--spike-factor {self.spike_factor}: must be more than 1")
        if (self.patience is None) != (self.monitor is None):
            raise TrainmateError("--patience and --monitor go together")
        if self.patience is not None and self.patience < 1:
            raise TrainmateError(f"--patience {self.patience}: must be 1 or more")
        if self.tensorboard not in ("auto", "on", "off"):
            raise TrainmateError(f"--tensorboard {self.tensorboard}: choose one of auto, on, off")
        if self.mode not in ("min", "max"):
            raise TrainmateError(f"--mode {self.mode}: min or max")
        if self.accumulate < 1:
            raise TrainmateError(f"--accumulate {self.accumulate}: must be 1 or more")
        if self.clip is not None and not self.clip > 0:
            raise TrainmateError(f"--clip {self.clip}: must be a positive max norm")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except RuntimeError:
                raise TrainmateError(
                    f"--device {self.device}: not a device (auto, cpu, cuda, cuda:N, mps)"
                ) from None
