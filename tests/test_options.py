"""The `%%train` option table drives the parser, the checks, `--help`, `%%train?` and the docs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import jupyter_trainmate
from jupyter_trainmate.errors import TrainmateError
from jupyter_trainmate.runtime.options import (
    HelpShown,
    TrainOptions,
    build_parser,
    option_specs,
    parse_options,
)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_every_field_is_an_option_of_the_parser() -> None:
    fields = [f.name for f in dataclasses.fields(TrainOptions)]
    assert [s.name for s in option_specs()] == fields
    parser_flags = {a.option_strings[0] for a in build_parser()._actions} - {"-h"}
    assert parser_flags == {"--" + name.replace("_", "-") for name in fields}


def test_help_lists_each_option_with_its_help_text() -> None:
    text = _flat(build_parser().format_help())
    for spec in option_specs():
        assert spec.flag in text
        assert _flat(spec.help_line) in text, spec.name


def test_the_user_guide_and_the_magic_docstring_come_from_the_table() -> None:
    from jupyter_trainmate.magic import TrainmateMagics

    guide = jupyter_trainmate.__doc__ or ""
    table = guide[guide.index("## `%%train` options") :]
    rows = [line for line in table.splitlines() if line.startswith("| `--")]
    assert [row.split("`")[1].split()[0] for row in rows] == [s.flag for s in option_specs()]
    assert build_parser().format_help() in (TrainmateMagics.train.__doc__ or "")


def test_an_empty_line_gives_the_defaults() -> None:
    assert parse_options("") == TrainOptions()


@pytest.mark.parametrize("spec", [s for s in option_specs() if s.choices], ids=lambda s: s.name)
def test_choices_are_checked_from_their_literal_type(spec: object) -> None:
    from jupyter_trainmate.runtime.options import OptionSpec

    assert isinstance(spec, OptionSpec)
    needs = {
        "backend": "--procs 2",
        "sampler": "--sweep 2 --monitor val",
        "prune": "--sweep 2 --monitor val",
    }
    for choice in spec.choices:
        line = f"{needs.get(spec.name, '')} {spec.flag} {choice}"
        assert getattr(parse_options(line), spec.name) == choice
    with pytest.raises(TrainmateError, match=f"{spec.flag} nope: choose one of"):
        parse_options(f"{spec.flag} nope")


def test_bare_values_and_repeats(tmp_path: Path) -> None:
    options = parse_options(
        "--checkpoint --tune-loader --resume --set lr=1 --set momentum=0", tmp_path
    )
    assert options.checkpoint == str(tmp_path / "checkpoints")
    assert options.tune_loader == 8
    assert options.set == ("lr=1", "momentum=0")
    with pytest.raises(TrainmateError, match="unrecognized arguments: --bogus"):
        parse_options("--bogus")
    with pytest.raises(TrainmateError, match="argument --keep: invalid int value"):
        parse_options("--keep many")
    with pytest.raises(HelpShown):
        parse_options("--help")


def test_train_function_parses_the_same_way() -> None:
    def fit() -> None:
        raise AssertionError("must not run")

    with pytest.raises(TrainmateError, match="--amp fp9: choose one of"):
        jupyter_trainmate.train(fit, "--amp fp9")
    # what only a cell can do is refused in one line, never run silently in one process
    with pytest.raises(TrainmateError, match=r"train\(\): --procs runs from a %%train cell"):
        jupyter_trainmate.train(fit, "--procs 2")
    # a sweep of a function with no suggest() has nothing to search: refused before any trial
    with pytest.raises(TrainmateError, match=r"--sweep 3: nothing to search"):
        jupyter_trainmate.train(fit, "--sweep 3 --monitor val_loss")


def test_magic_help_prints_the_table_and_runs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "jupyter_trainmate")
        ip.run_cell_magic("train", "--help", "raise RuntimeError('must not run')\n")
        assert _flat(capsys.readouterr().out) == _flat(build_parser().format_help())
        with pytest.raises(UsageError, match="%%train: --mode up: choose one of min, max"):
            ip.run_cell_magic("train", "--mode up", "pass\n")
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize(
    ("line", "error"),
    [
        # a restart in one rank would leave the others in their collectives
        ("--procs 2 --checkpoint c --retries 1", "--procs and --retries together"),
        # a NaN in one rank's loss: that rank alone would skip its backward (and all-reduce)
        ("--procs 2 --on-nan skip", "--procs and --on-nan skip together"),
        ("--procs gpus --on-nan rollback", "--procs and --on-nan rollback together"),
    ],
)
def test_options_that_do_not_go_together_are_one_line_errors(line: str, error: str) -> None:
    with pytest.raises(TrainmateError, match=re.escape(error)):
        parse_options(line)
