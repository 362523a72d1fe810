from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_trainmate")
    yield shell
    InteractiveShell.clear_instance()


def test_load_ext_registers_trainmate(ip: InteractiveShell) -> None:
    assert "trainmate" in ip.magics_manager.magics["line"]


def test_doctor_json_from_the_kernel(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_line_magic("trainmate", "doctor --json")
    report = json.loads(capsys.readouterr().out)
    torch_check = next(c for c in report["checks"] if c["check"] == "torch")
    assert torch_check["data"]["version"] == torch.__version__


def test_bad_arguments_raise_usage_error(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="%trainmate"):
        ip.run_line_magic("trainmate", "doctor --no-such-flag")


def test_bad_data_path_is_a_usage_error(ip: InteractiveShell, tmp_path: object) -> None:
    with pytest.raises(UsageError, match=r"--data .*missing: No such file"):
        ip.run_line_magic("trainmate", f"doctor --data {tmp_path}/missing")
