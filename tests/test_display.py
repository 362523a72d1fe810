"""The display's parts: bounded histories, the throttle, the run-state model, the chart, the views."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest

from jupyter_trainmate.display.chart import line_chart
from jupyter_trainmate.display.history import BoundedSeries
from jupyter_trainmate.display.live import Throttle
from jupyter_trainmate.display.render import duration, html_block, progress_text
from jupyter_trainmate.display.state import RunState
from jupyter_trainmate.display.views import TextView
from jupyter_trainmate.monitor import GpuReport
from jupyter_trainmate.monitor.fake import FakeGpuSource
from jupyter_trainmate.monitor.host import HostSample, HostSource
from jupyter_trainmate.monitor.sampler import DeviceSample, Sampler
from jupyter_trainmate.runtime.summary import RunProgress


def progress(steps: int, loss: float | None = 1.0, **kw: object) -> RunProgress:
    base: dict[str, object] = {
        "steps": steps, "samples": steps * 32, "optimizer_steps": steps, "epoch": 1, "epochs_total": 4,
        "step_in_epoch": steps % 100, "steps_per_epoch": 100, "fraction": steps / 400, "eta_s": 90.0,
        "wall_s": 12.0, "samples_per_s": 1000.0, "steps_per_s": 30.0, "data_wait_share": 0.25,
        "last_loss": loss, "device": "cpu", "amp": "off",
    }  # fmt: skip
    base.update(kw)
    return RunProgress(**base)  # type: ignore[arg-type]


def test_bounded_series_stays_bounded_and_keeps_recent_detail() -> None:
    s = BoundedSeries(max_points=64)
    for i in range(100_000):
        s.append(i, float(i))
    assert len(s) <= 65
    assert s.xs[-32:] == [float(i) for i in range(100_000 - 32, 100_000)]  # recent: exact
    assert s.xs == sorted(s.xs)  # archiving keeps the order
    assert s.xs[0] < 5_000  # the distant past is still there, averaged
    gaps = [b - a for a, b in zip(s.xs[:20], s.xs[1:21], strict=True)]
    assert max(gaps) <= 2 * min(gaps)  # and evenly covered
    assert all(x == y for x, y in s.points())


def test_throttle_lets_one_update_per_interval() -> None:
    t = Throttle(0.25)
    times = [0.0, 0.1, 0.2, 0.26, 0.3, 0.51, 0.52, 1.0]
    assert [t.ready(now) for now in times] == [True, False, False, True, False, True, False, True]


def test_run_state_records_one_loss_point_per_new_step_and_logged_metrics() -> None:
    state = RunState(max_points=32)
    state.observe(progress(10, 2.0), None)
    state.observe(progress(10, 2.0), None)  # no new step: no new point
    state.observe(progress(20, 1.5), None)
    state.log(20, {"val_acc": 0.5})
    state.log(40, {"val_acc": 0.75})
    state.event("NaN in loss at step 33: skipped")
    snap = state.snapshot(amp="off", loss_scale=None, skipped_steps=0)
    assert snap.loss == [(10, 2.0), (20, 1.5)]
    assert snap.metrics == {"val_acc": [(20, 0.5), (40, 0.75)]}
    assert snap.events == ("NaN in loss at step 33: skipped",)


def test_device_lines_without_a_gpu_show_cpu_and_process_memory() -> None:
    state = RunState()
    host = HostSample(cpu_percent=42.0, cpus=2, memory_used_bytes=3 * 2**30, memory_total_bytes=8 * 2**30,
                      limited_by_cgroup=False)  # fmt: skip
    no_gpu = GpuReport(False, "nvml", "no driver")
    state.observe(progress(5), DeviceSample(no_gpu, host, 512 * 2**20))
    lines = state.snapshot(amp="off", loss_scale=None, skipped_steps=0).devices
    assert [(d.label, d.util_pct) for d in lines] == [("CPU (2)", 42.0), ("this process", None)]
    assert lines[1].memory_used_bytes == 512 * 2**20


def test_gpu_utilisation_history_from_the_fake_source() -> None:
    fake = FakeGpuSource.from_json(
        '[{"name": "G0", "utilization_pct": 30}, {"name": "G1", "utilization_pct": 70}]'
    )
    sampler = Sampler(fake)
    state = RunState()
    state.observe(progress(5), sampler.sample_once())
    assert state.gpu_util.ys == [50.0]
    assert state.gpu_memory_fraction == pytest.approx(0.1)
    assert [
        d.label for d in state.snapshot(amp="bf16", loss_scale=None, skipped_steps=0).devices
    ] == [
        "GPU 0 G0",
        "GPU 1 G1",
    ]


def test_sampler_keeps_the_latest_reading() -> None:
    fake = FakeGpuSource.from_json("[{}]")
    sampler = Sampler(fake)
    assert sampler.latest is None
    first = sampler.sample_once()
    fake.set_utilization(0, 99.0)
    second = sampler.sample_once()
    assert (sampler.samples, fake.calls) == (2, 2)
    assert sampler.latest is second
    assert first.gpu.gpus[0].utilization_pct == 50.0
    assert second.gpu.gpus[0].utilization_pct == 99.0
    assert second.process_rss_bytes > 0


def test_chart_draws_each_series_and_skips_non_finite_points() -> None:
    svg = line_chart(
        {"loss": [(0, 2.0), (1, float("nan")), (2, 1.0)], "acc <x>": [(0, 0.1), (2, 0.9)]}
    )
    assert svg.startswith("<svg")
    assert svg.count("<polyline") == 2
    assert 'data-series="acc &lt;x&gt;"' in svg  # names are escaped
    loss_points = re.search(r'data-series="loss" points="([^"]+)"', svg)
    assert loss_points is not None
    assert len(loss_points.group(1).split()) == 2
    assert "waiting for the first steps" in line_chart({"loss": []})


def test_progress_text_and_html_block() -> None:
    state = RunState()
    state.observe(progress(150), None)
    snap = state.snapshot(amp="fp16", loss_scale=1024.0, skipped_steps=3)
    assert progress_text(snap) == "38% | epoch 1/4 | step 50/100 | elapsed 12s | ETA 1m 30s"
    block = html_block(snap, "%%train <loader>")
    assert "%%train &lt;loader&gt;" in block
    assert "amp fp16 (scale 1024), 3 skipped" in block
    assert duration(3725) == "1h 02m"


def test_text_view_is_quiet_for_short_runs_then_prints_one_line() -> None:
    out = io.StringIO()
    view = TextView("%%train loader", stream=out)
    state = RunState()
    state.observe(progress(10), None)
    view.update(state.snapshot(amp="off", loss_scale=None, skipped_steps=0))
    assert out.getvalue() == ""
    view.started -= view.interval
    view.update(state.snapshot(amp="off", loss_scale=None, skipped_steps=0))
    (line,) = out.getvalue().splitlines()
    assert line.startswith("[%%train loader] 2% | epoch 1/4 | step 10/100")
    assert "1,000 samples/s" in line
    assert "data wait 25%" in line


def test_host_source_honours_cgroup_v2_limits(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a CPU
    (tmp_path / "memory.max").write_text(str(2 * 2**30))
    (tmp_path / "memory.current").write_text(str(2**30))
    (tmp_path / "cpu.stat").write_text("usage_usec 1000000\nuser_usec 0\n")
    source = HostSource(tmp_path)
    first = source.sample()
    assert first.memory_total_bytes == 2 * 2**30
    assert first.memory_used_bytes == 2**30
    assert first.limited_by_cgroup
    assert first.cpus == 1
    time.sleep(0.2)
    (tmp_path / "cpu.stat").write_text("usage_usec 1100000\n")  # 0.1 CPU-seconds more
    second = source.sample()
    # 0.1 s of CPU in ~0.2 s of wall time against a 0.5-CPU quota: close to 100%, capped at 100
    assert 60.0 <= second.cpu_percent <= 100.0
