from __future__ import annotations

import subprocess
import sys

import pytest

import jupyter_trainmate
from jupyter_trainmate.cli import main


def test_version_matches_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"jupyter_trainmate {jupyter_trainmate.__version__}"


def test_help_lists_real_subcommands_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "doctor" in out
    assert "runs" in out
    assert "refactor" in out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "required: COMMAND" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_trainmate", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert jupyter_trainmate.__version__ in proc.stdout


def test_import_is_light() -> None:
    """`%load_ext jupyter_trainmate` must not drag torch or the server into a kernel's start."""
    code = (
        "import sys, jupyter_trainmate;"
        "print(sorted(m for m in ('torch', 'tornado', 'jupyter_server', 'libcst') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
