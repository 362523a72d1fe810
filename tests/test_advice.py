"""Every advice rule on scripted measurements: it fires on its numbers and names them."""

from __future__ import annotations

from jupyter_trainmate.display.advice import LoaderInfo, Measurements, advise
from jupyter_trainmate.runtime.prefetch import RESULTS_CHANGE

LOADER = LoaderInfo(
    num_workers=0, pin_memory=False, persistent_workers=False, prefetch_factor=None, batch_size=32
)


def rules(m: Measurements) -> dict[str, str]:
    return {a.rule: a.message for a in advise(m)}


def test_quiet_on_a_healthy_run() -> None:
    m = Measurements("cuda", steps=500, data_wait_share=0.02, gpu_util_pct=95, gpu_memory_used_fraction=0.8,
                     bf16_capable=True, amp="bf16", loader=LOADER, cpus=8)  # fmt: skip
    assert advise(m) == []


def test_nothing_before_enough_steps() -> None:
    assert advise(Measurements("cpu", steps=5, data_wait_share=0.9, loader=LOADER, cpus=8)) == []


def test_data_wait_names_num_workers_and_cpu_count() -> None:
    found = rules(Measurements("cuda", steps=100, data_wait_share=0.35, loader=LOADER, cpus=16))
    text = found["data-wait"]
    assert "35% of step time waits for data" in text
    assert "num_workers=0: raise it (this machine has 16 CPUs)" in text
    assert "pin_memory=True" in text


def test_data_wait_with_workers_suggests_persistence_and_prefetch() -> None:
    loader = LoaderInfo(
        num_workers=15, pin_memory=True, persistent_workers=False, prefetch_factor=2, batch_size=64
    )
    text = rules(Measurements("cuda", steps=100, data_wait_share=0.2, loader=loader, cpus=16))[
        "data-wait"
    ]
    assert "num_workers" not in text
    assert "persistent_workers=True" in text
    assert "prefetch_factor=2: try 4" in text
    assert "pin_memory" not in text


def test_data_wait_on_cpu_suggests_thread_prefetch() -> None:
    text = rules(Measurements("cpu", steps=100, data_wait_share=0.5, loader=LOADER, cpus=2))[
        "data-wait"
    ]
    assert "--prefetch thread" in text
    assert "num_workers=0: raise it (this machine has 2 CPUs)" in text


def test_gpu_idle_names_the_item_line_and_batch_size() -> None:
    m = Measurements(
        "cuda", steps=100, data_wait_share=0.03, gpu_util_pct=31, loader=LOADER, item_lines=(12,)
    )
    text = rules(m)["gpu-idle"]
    assert "GPU busy 31%" in text
    assert ".item() on line 12" in text
    assert "batch_size=32" in text


def test_gpu_idle_is_not_blamed_on_host_when_data_waits() -> None:
    m = Measurements("cuda", steps=100, data_wait_share=0.4, gpu_util_pct=20, loader=LOADER, cpus=4)
    assert "gpu-idle" not in rules(m)
    assert "data-wait" in rules(m)


def test_memory_mostly_free_suggests_a_larger_batch() -> None:
    m = Measurements("cuda", steps=100, data_wait_share=0.0, gpu_util_pct=90, gpu_memory_used_fraction=0.2,
                     gpu_memory_total_gib=80)  # fmt: skip
    assert rules(m)["memory-free"] == "GPU memory 20% used of 80 GiB: a larger batch would fit"


def test_fp32_on_a_bf16_gpu() -> None:
    m = Measurements(
        "cuda", steps=100, data_wait_share=0.0, gpu_util_pct=90, bf16_capable=True, amp="off"
    )
    assert "--amp bf16" in rules(m)["amp-bf16"]
    assert "amp-bf16" not in rules(Measurements("cpu", steps=100, data_wait_share=0.0, amp="off"))


def test_fp16_with_many_skipped_steps_suggests_bf16() -> None:
    m = Measurements("cuda", steps=100, data_wait_share=0.0, gpu_util_pct=90, amp="fp16", bf16_capable=True,
                     skipped_steps=12, optimizer_steps=88)  # fmt: skip
    text = rules(m)["fp16-skips"]
    assert "12 steps (12%) skipped" in text
    assert "--amp bf16" in text
    few = Measurements("cuda", steps=100, data_wait_share=0.0, gpu_util_pct=90, amp="fp16", skipped_steps=2,
                       optimizer_steps=98)  # fmt: skip
    assert "fp16-skips" not in rules(few)


def test_data_wait_says_why_prefetch_auto_kept_loading_on_the_training_thread() -> None:
    m = Measurements(
        "cpu",
        steps=100,
        data_wait_share=0.5,
        loader=LOADER,
        cpus=2,
        prefetch="off",
        prefetch_note="fetching its samples draws random numbers (torch: augmentation?); "
        + RESULTS_CHANGE,
    )
    text = rules(m)["data-wait"]
    assert "--prefetch auto loads on the training thread: fetching its samples draws" in text
    assert "--prefetch thread would overlap loading with compute, but" in text
