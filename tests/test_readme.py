"""README.md tells the truth: its links resolve, its make targets exist, its code runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import jupyter_trainmate

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.DOTALL)
# Lines proven elsewhere: building and installing the wheel is what tests/test_wheel.py does.
PROVEN_BY_THE_WHEEL_TEST = ("python -m pip wheel", "python -m pip install dist/")


def _commands(language: str) -> list[str]:
    lines = [
        line.split("#")[0].strip()
        for lang, b in BLOCKS
        if lang == language
        for line in b.splitlines()
    ]
    return [line for line in lines if line]


def test_links_and_pictures_resolve_to_files_in_the_repository() -> None:
    targets = re.findall(r"\]\(([^)#]+)\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links its notebooks and docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing


def test_the_make_targets_it_names_exist() -> None:
    named = set(re.findall(r"`?make (\w+)`?", README))
    assert {"demo", "test", "lab", "docs", "screenshots"} <= named
    makefile = (ROOT / "Makefile").read_text()
    defined = set(re.findall(r"^([\w-]+):", makefile, flags=re.MULTILINE))
    assert named <= defined


def test_every_shell_command_runs_or_is_proven_by_the_wheel_test(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    bin_dir = Path(sys.executable).parent
    ran = 0
    for line in _commands("sh"):
        if line.startswith(("make ", *PROVEN_BY_THE_WHEEL_TEST)):
            continue  # make: the test above and CI itself; the wheel: tests/test_wheel.py
        program, *args = line.split()
        done = subprocess.run(
            [str(bin_dir / program), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        ran += 1
    assert ran >= 1
    assert (tmp_path / "quickstart_pkg" / "pyproject.toml").exists()


def test_the_python_usage_runs_under_train(capsys: pytest.CaptureFixture[str]) -> None:
    setup = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
EPOCHS = 2
x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
train_loader = DataLoader(TensorDataset(x, y), batch_size=32)
model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
"""
    python = [b for lang, b in BLOCKS if lang == "python"]
    assert python[0].strip() == "%load_ext jupyter_trainmate"
    line, _, body = python[1].partition("\n")
    assert line == "%%train"
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "jupyter_trainmate")
        assert ip.run_cell(setup).success
        ip.run_cell_magic("train", "--display off", body)
    finally:
        InteractiveShell.clear_instance()
    run = jupyter_trainmate.last_run()
    assert run is not None
    assert (run.steps, run.epochs, run.optimizer_steps) == (16, 2, 16)
