"""
Advice from the run's own measurements: each line names the number behind it.

Pure functions of a `Measurements` record, so every rule is tested on scripted numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..runtime.loader import LoaderInfo

__all__ = ["Advice", "LoaderInfo", "Measurements", "advise"]

DATA_WAIT_HIGH = 0.10
GPU_UTIL_LOW = 50.0
MEMORY_FREE = 0.5
SKIPPED_HIGH = 0.05


@dataclass(frozen=True)
class Measurements:
    """What the advisor looks at, all measured during the run (None: not measured)."""

    device_type: str
    steps: int
    data_wait_share: float
    gpu_util_pct: float | None = None
    gpu_memory_used_fraction: float | None = None
    gpu_memory_total_gib: float | None = None
    bf16_capable: bool = False
    amp: str = "off"
    skipped_steps: int = 0
    optimizer_steps: int = 0
    cpus: int = 1
    loader: LoaderInfo | None = None
    prefetch: str = "off"
    prefetch_note: str | None = None  # why --prefetch auto kept loading on the training thread
    item_lines: tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class Advice:
    rule: str
    message: str


MIN_STEPS = 20  # fewer steps than this measure start-up, not the run


def _data_wait(m: Measurements) -> list[Advice]:
    if m.data_wait_share <= DATA_WAIT_HIGH:
        return []
    share = f"{m.data_wait_share:.0%} of step time waits for data"
    tips = []
    loader = m.loader
    if loader is not None:
        if loader.num_workers < max(1, m.cpus - 1):
            tips.append(
                f"num_workers={loader.num_workers}: raise it (this machine has {m.cpus} CPUs)"
            )
        if loader.num_workers > 0 and not loader.persistent_workers:
            tips.append("persistent_workers=True keeps workers alive between epochs")
        if loader.num_workers > 0 and (loader.prefetch_factor or 2) <= 2:
            tips.append(f"prefetch_factor={loader.prefetch_factor or 2}: try 4")
        if m.device_type == "cuda" and not loader.pin_memory:
            tips.append("pin_memory=True speeds host-to-GPU copies")
    if m.device_type == "cpu" and m.prefetch == "off":
        if m.prefetch_note is not None:
            tips.append(f"--prefetch auto loads on the training thread: {m.prefetch_note}")
        else:
            tips.append(
                "%%train --prefetch thread overlaps loading with compute "
                "(changes the order of random draws)"
            )
    text = share + (": " + "; ".join(tips) if tips else "")
    return [Advice("data-wait", text)]


def _gpu_idle(m: Measurements) -> list[Advice]:
    if (
        m.gpu_util_pct is None
        or m.gpu_util_pct >= GPU_UTIL_LOW
        or m.data_wait_share > DATA_WAIT_HIGH
    ):
        return []
    causes = []
    if m.item_lines:
        lines = ", ".join(str(n) for n in m.item_lines)
        causes.append(f".item() on line {lines} waits for the GPU every step: log less often")
    batch = m.loader.batch_size if m.loader is not None else None
    causes.append(f"batch too small{f' (batch_size={batch})' if batch else ''}: raise it")
    return [
        Advice(
            "gpu-idle",
            f"GPU busy {m.gpu_util_pct:.0f}% of the time with little data wait "
            f"({m.data_wait_share:.0%}): host-side overhead; " + "; ".join(causes),
        )
    ]


def _memory_free(m: Measurements) -> list[Advice]:
    if m.gpu_memory_used_fraction is None or m.gpu_memory_used_fraction >= MEMORY_FREE:
        return []
    total = f" of {m.gpu_memory_total_gib:.0f} GiB" if m.gpu_memory_total_gib else ""
    return [
        Advice(
            "memory-free",
            f"GPU memory {m.gpu_memory_used_fraction:.0%} used{total}: a larger batch would fit",
        )
    ]


def _amp(m: Measurements) -> list[Advice]:
    if m.device_type == "cuda" and m.amp == "off" and m.bf16_capable:
        return [Advice("amp-bf16", "fp32 on a GPU with bf16: %%train --amp bf16 is usually faster")]
    if m.amp == "fp16" and m.optimizer_steps and m.skipped_steps / m.optimizer_steps > SKIPPED_HIGH:
        share = m.skipped_steps / (m.optimizer_steps + m.skipped_steps)
        hint = (
            "%%train --amp bf16 needs no loss scaling"
            if m.bf16_capable
            else "lower the learning rate"
        )
        return [
            Advice(
                "fp16-skips",
                f"{m.skipped_steps} steps ({share:.0%}) skipped for inf/NaN in fp16: {hint}",
            )
        ]
    return []


RULES = (_data_wait, _gpu_idle, _memory_free, _amp)


def advise(m: Measurements) -> list[Advice]:
    """Every rule's advice for these measurements; nothing before `MIN_STEPS` steps."""
    if m.steps < MIN_STEPS:
        return []
    return [advice for rule in RULES for advice in rule(m)]
