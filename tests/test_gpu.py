"""The CUDA paths end to end, on a real GPU (skipped where torch sees none; see conftest)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from jupyter_trainmate import last_run
from jupyter_trainmate.monitor.nvml import NvmlSource

from .train_harness import fresh_shell, weights

pytestmark = pytest.mark.gpu

CUDA_SETUP = """
import random
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.use_deterministic_algorithms(True)
random.seed(0)
torch.manual_seed(0)
x = torch.randn(512, 32)
y = (x[:, :4].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, pin_memory=True)
model = nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.2), nn.ReLU(), nn.Linear(64, 2)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
step_counter = 0
STOP_AT = -1
"""
CUDA_LOOP = """
for epoch in range(3):
    for xb, yb in loader:
        step_counter += 1
        if step_counter == STOP_AT:
            raise KeyboardInterrupt
        xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
"""


@pytest.fixture(autouse=True)
def _deterministic_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def test_nvml_source_reads_the_gpu_torch_sees() -> None:
    held = torch.ones(1, device="cuda")  # a CUDA context: NVML must see memory in use
    source = NvmlSource()
    try:
        report = source.sample()
    finally:
        source.close()
    assert report.available, report.reason
    assert report.source == "nvml"
    assert len(report.gpus) == torch.cuda.device_count()
    gpu = report.gpus[0]
    total = torch.cuda.get_device_properties(0).total_memory
    assert abs(gpu.memory_total_bytes - total) <= 0.02 * total
    assert 0 < gpu.memory_used_bytes <= gpu.memory_total_bytes
    assert gpu.utilization_pct is None or 0 <= gpu.utilization_pct <= 100
    assert gpu.name == torch.cuda.get_device_name(0)
    assert gpu.compute_capability == torch.cuda.get_device_capability(0)
    del held


def test_cuda_run_uses_amp_prefetch_and_gpu_timing() -> None:
    ip = fresh_shell()
    ip.run_cell(CUDA_SETUP).raise_error()
    ip.run_cell(f"%%train --display off\n{CUDA_LOOP}").raise_error()
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    assert summary.device.startswith("cuda")
    expected_amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert summary.amp == expected_amp
    assert summary.prefetch == "cuda"
    assert summary.steps == 3 * 16
    assert summary.compute_s > 0
    assert all(torch.isfinite(t).all() for t in weights(ip).values())


def test_cuda_interrupt_and_resume_is_bit_identical(tmp_path: Path) -> None:
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"]
    ref = fresh_shell()
    ref.run_cell(CUDA_SETUP).raise_error()
    ref.run_cell(f"%%train --amp off --display off\n{CUDA_LOOP}").raise_error()
    expected = weights(ref)

    ip = fresh_shell()
    ip.run_cell(CUDA_SETUP + "\nSTOP_AT = 21\n").raise_error()
    line = f"--amp off --display off --checkpoint {tmp_path}"
    ip.run_cell(f"%%train {line}\n{CUDA_LOOP}")
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "interrupted"
    ip.user_ns["STOP_AT"] = -1
    ip.run_cell(f"%%train {line} --resume\n{CUDA_LOOP}").raise_error()
    got = weights(ip)
    differing = [k for k in expected if not torch.equal(expected[k].cpu(), got[k].cpu())]
    assert not differing, differing


OOM_SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
data = TensorDataset(torch.randn(4 * 16384, 1024), torch.randint(0, 10, (4 * 16384,)))
loader = DataLoader(data, batch_size=BATCH)
model = nn.Sequential(
    nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10)
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
"""
OOM_LOOP = """
for xb, yb in loader:
    xb, yb = xb.cuda(), yb.cuda()
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
"""


def test_real_cuda_out_of_memory_is_recovered_with_micro_batches() -> None:
    """A real allocator OOM (the process capped at 0.75 GiB): the batch of 16384 (about 1.1 GiB of
    activations) is retried as micro-batches; the result matches --accumulate K on batches of
    16384 / K run without the cap."""
    total = torch.cuda.get_device_properties(0).total_memory
    ip = fresh_shell()
    ip.run_cell(OOM_SETUP.replace("BATCH", "16384")).raise_error()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.75 * 2**30 / total)
    try:
        ip.run_cell(f"%%train --amp off --display off\n{OOM_LOOP}").raise_error()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    summary = last_run()
    assert summary is not None
    assert summary.outcome == "finished"
    events = [e for e in summary.events if "out of memory" in e]
    assert events, summary.events
    parts = int(events[-1].split(" runs as ")[1].split()[0])
    assert parts >= 2
    got = weights(ip)

    ref = fresh_shell()
    ref.run_cell(OOM_SETUP.replace("BATCH", str(16384 // parts))).raise_error()
    ref.run_cell(f"%%train --amp off --display off --accumulate {parts}\n{OOM_LOOP}").raise_error()
    expected = weights(ref)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value)
    print(f"\nOOM recovery: {events}")
