"""The `trainmate` command."""

from __future__ import annotations

import argparse
import os
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


def _report(args: argparse.Namespace) -> int:
    from .report import report_command

    report_command(
        args.runs_dir, args.output, markdown=args.markdown, force=args.force, selected=args.runs
    )
    return 0


def _add_report_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = commands.add_parser(
        "report",
        help="one self-contained HTML (or Markdown) report of the recorded runs",
        description="Write the runs in RUNS_DIR/runs.jsonl as one HTML file that needs no "
        "network: outcome, duration, throughput, the parameters that differ, final and best "
        "metrics, curves overlaid, advice, sweeps. The same records give the same file.",
    )
    report.add_argument(
        "runs_dir", type=Path, nargs="?", default=Path("runs"), metavar="RUNS_DIR",
        help="the runs folder (default: runs)",
    )  # fmt: skip
    report.add_argument(
        "-o", "--output", type=Path, help="the report file (report.html; report.md with --markdown)"
    )
    report.add_argument(
        "--markdown", action="store_true", help="Markdown, with the charts as SVG files beside it"
    )
    report.add_argument("--force", action="store_true", help="replace existing output files")
    report.add_argument(
        "--runs", type=_numbers, metavar="N,N", help="the runs whose curves are overlaid (#N)"
    )
    report.set_defaults(run=_report)


def _sweeps(args: argparse.Namespace) -> int:
    from .sweep.storage import JOURNAL, list_studies

    print(list_studies(args.dir / JOURNAL))
    return 0


def _refactor(args: argparse.Namespace) -> int:
    # nbformat validates with jsonschema, whose import compiles the RFC 3987 grammars of the
    # optional `rfc3987_syntax` package (about 1.2 s on a quiet machine, most of the refactor's
    # start-up) only to offer an "iri" format check that notebook validation never asks for.
    # This process is ours and ends with the command: skip that package here.
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    from jupyter_trainmate.refactor.pipeline import refactor

    out, text = refactor(
        args.notebook,
        args.output,
        args.name,
        force=args.force,
        dry_run=args.dry_run,
        skip_bad_cells=args.skip_bad_cells,
        docs=not args.no_docs,
        typecheck=not args.no_typecheck,
        execute=args.execute,
        timeout=args.timeout,
        check_equivalence=args.check_equivalence,
    )
    if args.dry_run:
        print(text, end="")
    else:
        print(f"trainmate refactor: wrote {out} (see {out / 'REFACTOR_REPORT.md'})")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .deploy.command import remember, resolve, show
    from .deploy.export import export

    model, example = resolve(args)
    report = export(
        model,
        example,
        args.output,
        dynamic_batch=not args.static_batch,
        quantize=args.quantize,
        opset=args.opset,
        rtol=args.rtol,
    )
    show(report, args.format, getattr(args, "user_ns", None) is not None)
    remember("export", report, args)
    return 0 if report.passed else 1


def _bench(args: argparse.Namespace) -> int:
    from .deploy.bench import bench, bench_onnx
    from .deploy.command import onnx_file, remember, resolve, resolve_example, show

    exported = onnx_file(args)
    if exported is not None:
        report = bench_onnx(
            exported,
            resolve_example(args),
            batch_sizes=args.batch_sizes,
            precision=args.precision,
            min_run_time=args.min_run_time,
            threads=args.threads,
            rounds=args.rounds,
            clock=args.clock,
        )
    else:
        model, example = resolve(args)
        report = bench(
            model,
            example,
            batch_sizes=args.batch_sizes,
            precision=args.precision,
            backends=args.backends,
            min_run_time=args.min_run_time,
            threads=args.threads,
            rounds=args.rounds,
            clock=args.clock,
        )
    show(report, args.format, getattr(args, "user_ns", None) is not None)
    remember("bench", report, args)
    return 0


def _explain(args: argparse.Namespace) -> int:
    import json

    from .explain.build import explain_message
    from .explain.traceback_text import last_exception

    where = str(args.file) if args.file else "standard input"
    try:
        text = args.file.read_text(errors="replace") if args.file else sys.stdin.read()
    except OSError as exc:
        raise TrainmateError(f"{where}: {exc.strerror or exc}") from None
    found = last_exception(text)
    if found is None:
        raise TrainmateError(f"{where}: no exception found (expected a line `SomeError: message`)")
    explanation = explain_message(*found, chain=text)
    print(json.dumps(explanation.as_dict(), indent=2) if args.json else explanation.text())
    return 0


def _numbers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give numbers separated by commas") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _add_deploy_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .deploy.command import add_arguments

    export = commands.add_parser(
        "export",
        help="export a model to ONNX and check it in onnxruntime",
        description="Export to ONNX (dynamo exporter, then fallbacks), check the outputs against "
        "PyTorch in onnxruntime at batch sizes 1, 3 and 8, write the model and its report "
        "(MODEL.export.json) atomically. Exit status 1 when parity fails.",
    )
    add_arguments(export)
    export.add_argument(
        "-o", "--output", type=Path, default=Path("model.onnx"), help="the .onnx file (model.onnx)"
    )
    export.add_argument(
        "--quantize", choices=("int8",), help="also write MODEL.int8.onnx (dynamic MatMul/Gemm)"
    )
    export.add_argument("--opset", type=int, help="ONNX opset (default: the exporter's)")
    export.add_argument(
        "--static-batch", action="store_true", help="keep the example's batch size fixed"
    )
    export.add_argument(
        "--rtol", type=float, default=1e-4, help="relative tolerance of the parity check (1e-4)"
    )
    export.set_defaults(run=_export)

    bench = commands.add_parser(
        "bench",
        help="inference latency and throughput: eager, torch.compile, onnxruntime",
        description="Time the model per backend, precision and batch size (warm-up, "
        "torch.utils.benchmark's blocked autorange, eval mode, inference mode): p50/p95/p99, "
        "samples/s, peak memory, compile time, and the fastest configuration per batch size. "
        "MODEL may also be an exported .onnx file (onnxruntime only; --example per input).",
    )
    add_arguments(bench)
    bench.add_argument(
        "--batch-sizes", type=_numbers, default=(1, 8, 32), metavar="N,N", help="(1,8,32)"
    )
    bench.add_argument(
        "--precision", type=_names, default=("fp32", "bf16"), metavar="P,P", help="(fp32,bf16)"
    )
    bench.add_argument(
        "--backends",
        type=_names,
        default=("eager", "compile", "onnxruntime"),
        metavar="B,B",
        help="(eager,compile,onnxruntime)",
    )
    bench.add_argument(
        "--min-run-time", type=float, default=0.5, help="seconds of timed calls per row (0.5)"
    )
    bench.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    bench.add_argument(
        "--rounds", type=int, default=5, help="rounds the rows are timed in, interleaved (5)"
    )
    bench.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: latency as a caller waits it (default); cpu: the calling thread's CPU time "
        "on one thread, steadier on a busy machine (it leaves out waiting for a core)",
    )
    bench.set_defaults(run=_bench)


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
    _add_report_command(commands)

    sweeps = commands.add_parser(
        "sweeps",
        help="the %%train --sweep studies in runs/optuna.journal",
        description="List the Optuna studies of runs/optuna.journal: trials by state, the best "
        "value and its trial.",
    )
    sweeps.add_argument(
        "--dir", type=Path, default=Path("runs"), help="the runs folder (default: runs)"
    )
    sweeps.set_defaults(run=_sweeps)

    refactor = commands.add_parser(
        "refactor",
        help="turn a notebook into an installable Python package",
        description="Write the notebook as a package: modules by concern, notebook state as "
        "parameters, hyperparameters as a typed config with a CLI, dependencies in "
        "pyproject.toml, and REFACTOR_REPORT.md saying where every cell went. The notebook "
        "is never modified.",
    )
    refactor.add_argument("notebook", type=Path, help="the .ipynb file")
    refactor.add_argument(
        "-o",
        "--output",
        type=Path,
        help="output folder, new or written by an earlier refactor, never the notebook's own "
        "(default: beside the notebook, its name)",
    )
    refactor.add_argument("--name", help="the package's import name (default: from the file name)")
    refactor.add_argument(
        "--force",
        action="store_true",
        help="write into an existing output folder: replace only the files an earlier refactor "
        "wrote there (its .trainmate-refactor.json lists them) and still hold what it wrote; "
        "every other file is kept. A folder holding the notebook or files of yours is refused",
    )
    refactor.add_argument(
        "--dry-run", action="store_true", help="print the plan (the report), write nothing"
    )
    refactor.add_argument(
        "--skip-bad-cells",
        action="store_true",
        help="skip cells that do not parse (and report them) instead of stopping",
    )
    refactor.add_argument(
        "--no-docs", action="store_true", help="skip the pdoc HTML docs (docs/): faster"
    )
    refactor.add_argument(
        "--no-typecheck",
        action="store_true",
        help="do not run mypy on the package (inferred annotations are then not checked): faster",
    )
    refactor.add_argument(
        "--execute",
        action="store_true",
        help="run the notebook (nbclient, in a fresh temporary folder holding a copy of the files "
        "beside it, seeded) and record the types its functions saw: annotations, tensor shapes "
        "in docstrings, characterisation tests",
    )
    refactor.add_argument(
        "--timeout", type=int, default=600, help="seconds a cell may run with --execute (600)"
    )
    refactor.add_argument(
        "--check-equivalence",
        action="store_true",
        help="with --execute: run the package's training with the notebook's config (same seeds, "
        "a fresh folder with the same copy) and compare its numbers with the notebook's (exit 2 "
        "if they differ)",
    )
    refactor.set_defaults(run=_refactor)
    _add_deploy_commands(commands)

    explain = commands.add_parser(
        "explain",
        help="explain a PyTorch error from a saved traceback",
        description="Read a traceback (a file, or standard input) and print what happened, the "
        "likely cause and the fixes, as %%train shows them when a cell fails (here from the "
        "message alone: the frames' values are not in the text).",
    )
    explain.add_argument("file", nargs="?", type=Path, help="the traceback (default: stdin)")
    explain.add_argument("--json", action="store_true", help="print kind, message, cause, advice")
    explain.set_defaults(run=_explain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.run(args)
    except TrainmateError as exc:
        print(f"trainmate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if argv is None and args.command == "refactor":
        _hard_exit(result)
    return result


def _hard_exit(status: int) -> None:
    """End the `trainmate refactor` command without tearing the interpreter down, as mypy's own
    command does (`fast_exit`): the refactor leaves about 1.7 million objects (libcst trees,
    mypy's symbol tables) whose freeing at exit took 5.5 s of a 28 s command on 500 real cells.
    Everything is written and closed by then; only the standard streams need flushing. Only for
    the command itself (`argv is None`): a caller of `main([...])` keeps its interpreter."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
