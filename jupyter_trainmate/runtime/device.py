"""
Where a run trains: the device of the notebook's parameters, or `--device`, and the prefetch mode
that follows from it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import TrainmateError


def params_device(namespace: Mapping[str, object]) -> torch.device | None:
    """Where the training happens: the parameters of an optimizer, else of a model, in `namespace`."""
    values = list(namespace.values())
    for value in values:
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                for p in group["params"]:
                    return torch.device(p.device)
    for value in values:
        if isinstance(value, torch.nn.Module):
            for p in value.parameters():
                return torch.device(p.device)
    return None


def same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        index_a = a.index if a.index is not None else torch.cuda.current_device()
        index_b = b.index if b.index is not None else torch.cuda.current_device()
        return index_a == index_b
    return True


class Placement:
    """The run's device (`--device`, else the parameters', else CUDA when there is one) and
    whether the parameters are known to be there (prefetching to CUDA needs them to be)."""

    def __init__(self, device: str, prefetch: str, namespace: Mapping[str, object]) -> None:
        self._namespace = namespace
        found = params_device(namespace)
        if device == "auto":
            self.device = found or torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self._confirmed = found is not None
        else:
            self.device = torch.device(device)
            if found is not None and not same_device(found, self.device):
                raise TrainmateError(
                    f"--device {device}: the model's parameters are on {found}; "
                    "move the model there or drop --device"
                )
            self._confirmed = True
        if prefetch == "cuda" and self.device.type != "cuda":
            raise TrainmateError(f"--prefetch cuda: the run is on {self.device}")
        if prefetch == "auto" and self.device.type == "cuda":
            prefetch = "cuda"  # on the CPU "auto" stays: a thread per loader that draws nothing
        self.prefetch_mode = prefetch

    def confirmed(self) -> bool:
        """Whether the parameters are on the run's device (checked again until they are: a cell
        may create its model after the session started)."""
        if not self._confirmed:
            found = params_device(self._namespace)
            self._confirmed = found is not None and same_device(found, self.device)
        return self._confirmed
