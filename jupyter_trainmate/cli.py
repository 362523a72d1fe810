"""The `trainmate` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._version import __version__
from .errors import TrainmateError


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks
    from .doctor.report import passed, to_json, to_table

    findings = run_checks(args.data)
    print(to_json(findings) if args.json else to_table(findings))
    return 0 if passed(findings) else 1


def _runs(args: argparse.Namespace) -> int:
    from .runs_table import runs_command

    return runs_command(args.dir, args.markdown)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainmate",
        description="Train PyTorch models in Jupyter: fast, observable and clean enough to ship.",
    )
    parser.add_argument("--version", action="version", version=f"jupyter_trainmate {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor = commands.add_parser(
        "doctor",
        help="check this machine before a long training run",
        description="Check Python, torch, CUDA, GPUs, TF32, pip, the environment, CPUs, memory "
        "and /dev/shm; with --data, also where the training data lives and how fast it reads. "
        "Exit status 0 when no check fails.",
    )
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    doctor.add_argument(
        "--data", type=Path, metavar="PATH", help="training data: file system, disk, read speed"
    )
    doctor.set_defaults(run=_doctor)

    runs = commands.add_parser(
        "runs",
        help="the recorded %%train runs, as a table or in a Markdown file",
        description="Show the run records (runs/runs.jsonl) as a table; with --markdown, write "
        "or update the table between <!-- trainmate:runs:start/end --> markers in that file.",
    )
    runs.add_argument(
        "--dir", type=Path, default=Path("runs"), help="the runs folder (default: runs)"
    )
    runs.add_argument(
        "--markdown", type=Path, metavar="FILE", help="update the table in this Markdown file"
    )
    runs.set_defaults(run=_runs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.run(args)
    except TrainmateError as exc:
        print(f"trainmate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
