"""`trainmate refactor` on the failure classes found in this round (BENCHMARKS.md "A constant the
script binds again; a fourth wave of real notebooks"): each a small notebook of our own, refactored
statically; the package passes the gate and computes what the notebook computed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

from tests.test_refactor_wave3 import refactored_clean, run_value


def test_a_constant_the_script_binds_again_keeps_its_first_value(tmp_path: Path) -> None:
    """`BATCH_SIZE = 50`, read by a section, then `BATCH_SIZE = 64` in a later section whose
    class reads it (MorvanZhou's DQN and GAN tutorials, concatenated in the speed benchmark's
    notebook): the name is module state of `train`, and its declaration `BATCH_SIZE: Any = None`
    came after `from .config import BATCH_SIZE`, so the first section read None (a TypeError)
    and the gate saw a redefinition (F811). The config's value is the first one now, and
    `run()` sets it from its `Config` (so `--batch-size` counts)."""
    out = refactored_clean(
        tmp_path,
        "rebatch",
        [
            new_code_cell("BATCH_SIZE = 50"),
            new_markdown_cell("## First"),
            new_code_cell("first = len([0] * BATCH_SIZE)"),
            new_markdown_cell("## Again"),
            new_code_cell(
                "BATCH_SIZE = 64\n\nclass Agent:\n    def learn(self):\n"
                "        return len([0] * BATCH_SIZE)\n\nsecond = Agent().learn()"
            ),
            new_code_cell("total = first * 1000 + second"),
        ],
    )
    assert run_value(out, "rebatch", "result['total']") == "50064"
    code = (out / "rebatch" / "train.py").read_text()
    assert "BATCH_SIZE: Any" not in code
    proc = subprocess.run(
        [sys.executable, "-c", "from rebatch.train import run; from rebatch.config import Config;"
         " print(run(Config(batch_size=7))['total'])"],
        cwd=out, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout.strip() == "7064"


def test_a_definition_head_reads_the_version_live_where_it_stands(tmp_path: Path) -> None:
    """What a definition's head reads runs where the definition stands: `class
    Fraction(Fraction):` a second time derives from the first version (it was written `class
    Fraction_v2(Fraction_v2)`, a NameError on import), and a default `h=g` is the `g` of that
    point, not the one live where the function is called later (it printed `2 2`)."""
    out = refactored_clean(
        tmp_path,
        "heads",
        [
            new_code_cell("from fractions import Fraction"),
            new_markdown_cell("## One"),
            new_code_cell(
                "class Fraction(Fraction):\n    def half(self):\n        return self / 2"
            ),
            new_code_cell("def g():\n    return 1\n\ndef f(h=g):\n    return h()"),
            new_code_cell("a = Fraction(1, 3).half()"),
            new_markdown_cell("## Two"),
            new_code_cell(
                "class Fraction(Fraction):\n    def third(self):\n        return self / 3"
            ),
            new_code_cell("def g():\n    return 2"),
            new_code_cell(
                "b = Fraction(1, 3).third()\nc = Fraction(1, 3).half()\n"
                "seen = f'{a} {b} {c} {f()} {g()}'"
            ),
        ],
    )
    assert run_value(out, "heads", "result['seen']") == "1/6 1/9 1/6 1 2"
