"""`trainmate doctor`: real values from this machine, and the GPU paths through a fake NVML report."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jupyter_trainmate.doctor import Finding, run_checks
from jupyter_trainmate.doctor.checks import read_gpus, suggested_num_workers, system_findings
from jupyter_trainmate.doctor.report import passed, to_table
from jupyter_trainmate.doctor.storage import storage_findings
from jupyter_trainmate.monitor import GpuReport, GpuSample
from jupyter_trainmate.monitor.host import cgroup_cpu_limit, cgroup_memory_limit, usable_cpus


def by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


@pytest.fixture(scope="module")
def findings() -> dict[str, Finding]:
    return by_check(run_checks())


def test_versions_are_the_real_ones(findings: dict[str, Finding]) -> None:
    assert findings["torch"].data["version"] == torch.__version__
    assert findings["torch"].data["cuda"] == torch.version.cuda
    assert findings["python"].data["version"] == platform.python_version()
    assert findings["python"].data["executable"] == sys.executable


def test_cuda_answer_matches_torch(findings: dict[str, Finding]) -> None:
    assert findings["cuda"].data["available"] is torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert findings["cuda"].status == "ok"  # no GPU is a normal answer
        assert "training runs on the CPU" in findings["cuda"].advice


def test_no_nvml_is_a_normal_answer(findings: dict[str, Finding]) -> None:
    report = read_gpus()
    if report.available:
        pytest.skip("this machine has NVML; see test_gpu_rows_from_nvml")
    assert findings["gpu"].status == "ok"
    assert report.reason in findings["gpu"].value


def test_environment_cpu_memory_shm(findings: dict[str, Finding]) -> None:
    assert findings["environment"].data["kind"] == (
        "venv" if sys.prefix != sys.base_prefix else "system"
    )
    assert findings["cpu"].data["usable"] == usable_cpus()
    assert findings["cpu"].data["logical"] == os.cpu_count()
    assert findings["cpu"].data["num_workers"] == suggested_num_workers(usable_cpus(), 0)
    st = os.statvfs("/dev/shm")
    assert findings["/dev/shm"].data["size_bytes"] == st.f_frsize * st.f_blocks
    assert findings["memory"].data["total_bytes"] > 0


def test_pip_check_agrees_with_pip(findings: dict[str, Finding]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, check=False)
    assert (findings["pip check"].status == "ok") is (proc.returncode == 0)


def test_num_workers_rule() -> None:
    assert suggested_num_workers(2, 0) == 1
    assert suggested_num_workers(1, 0) == 0
    assert suggested_num_workers(64, 0) == 8
    assert suggested_num_workers(32, 4) == 7


def fake_nvml(*ccs: tuple[int, int]) -> GpuReport:
    gpus = tuple(
        GpuSample(i, f"Fake GPU {i}", f"GPU-{i}", 10.0, 0, 80 * 1024**3, 40.0, 100.0, 300.0, (), cc)
        for i, cc in enumerate(ccs)
    )
    return GpuReport(True, "fake", driver_version="575.51", cuda_driver_version="12.9", gpus=gpus)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-torch-on-a-GPU-machine path")
def test_cpu_torch_on_a_gpu_machine_fails_with_advice() -> None:
    found = by_check(system_findings(lambda: fake_nvml((9, 0), (7, 0))))
    assert found["cuda"].status == "fail"
    assert "CUDA build" in found["cuda"].advice
    assert not passed(list(found.values()))
    assert "Fake GPU 0, 80.0 GiB, compute 9.0, bf16 yes, driver 575.51" in found["gpu 0"].value
    assert "bf16 no" in found["gpu 1"].value
    assert "GradScaler" in found["gpu 1"].advice
    assert found["cpu"].data["num_workers"] == suggested_num_workers(usable_cpus(), 2)


def test_cgroup_v2_limits(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "memory.max").write_text("4294967296\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    assert cgroup_memory_limit(tmp_path) == 4 * 1024**3
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_cpu_limit(tmp_path) is None
    assert cgroup_memory_limit(tmp_path) is None


def test_cgroup_v1_limits(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "memory").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_cpu_limit(tmp_path) == 2.0
    assert cgroup_memory_limit(tmp_path) is None  # v1's "unlimited"
    assert usable_cpus(tmp_path) <= 2


def test_data_checks_read_the_files(tmp_path: Path) -> None:
    payload = os.urandom(3 * 1024**2)
    (tmp_path / "shard-0.bin").write_bytes(payload)
    (tmp_path / "shard-1.bin").write_bytes(payload[:1000])
    found = by_check(storage_findings(tmp_path))
    assert found["data read"].data["files"] == 2
    assert found["data read"].data["bytes"] == len(payload) + 1000
    assert found["data read"].data["mb_per_s"] > 0
    mount = found["data fs"].data
    assert Path(mount["mountpoint"]) in [tmp_path, *tmp_path.parents]
    assert mount["network"] is False


def test_tmpfs_has_no_block_device() -> None:
    shm = Path("/dev/shm")
    found = by_check(storage_findings(shm))
    assert found["data fs"].data["fstype"] == "tmpfs"
    assert found["data disk"].data["kind"] is None


def test_table_has_one_row_per_check(findings: dict[str, Finding]) -> None:
    table = to_table(list(findings.values()))
    for check in findings:
        assert any(line.split()[1:2] == [check.split()[0]] for line in table.splitlines())
    assert "failed" in table.splitlines()[-1]


def test_cli_json_with_data(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"x" * 4096)
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_trainmate", "doctor", "--json", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    report = json.loads(proc.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert proc.returncode == (0 if report["ok"] else 1)
    assert checks["torch"]["data"]["version"] == torch.__version__
    assert checks["data read"]["data"]["bytes"] == 4096
    assert report["summary"]["ok"] + report["summary"]["warn"] + report["summary"]["fail"] == len(
        checks
    )


def test_cli_bad_data_path_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_trainmate", "doctor", "--data", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert f"--data {tmp_path / 'nope'}: No such file or directory" in proc.stderr


@pytest.mark.gpu
def test_gpu_rows_from_nvml(findings: dict[str, Finding]) -> None:
    assert findings["cuda"].status == "ok"
    assert findings["cuda"].data["device_count"] == torch.cuda.device_count()
    gpu0 = findings["gpu 0"].data
    assert gpu0["name"] == torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    assert gpu0["compute_capability"] == f"{major}.{minor}"
    assert gpu0["bf16"] is ((major, minor) >= (8, 0))
    assert findings["cudnn"].data["version"] == torch.backends.cudnn.version()
