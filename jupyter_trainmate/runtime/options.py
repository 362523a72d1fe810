"""
The `%%train` options, defined once.

`TrainOptions` is the table: each field is one option (`--tune-loader` for `tune_loader`), its
type says what the option takes (a `Literal` is a choice, `bool` a flag, `tuple[str, ...]` a
repeatable option, `X | None` an optional value) and its metadata holds the help text. From it come
the parser of the magic and of `jupyter_trainmate.train()` (`parse_options`), the checks of the
choices, `%%train --help` and `%%train?`, and the options table of the user guide
(`options_markdown`). A new option is one field here.

This module imports no torch, so the user guide can list the options at import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import typing
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal, NoReturn

from ..errors import TrainmateError

AmpMode = Literal["auto", "bf16", "fp16", "off"]
PrefetchMode = Literal["auto", "off", "cuda", "thread"]
DisplayMode = Literal["auto", "widget", "text", "off"]
NanPolicy = Literal["off", "stop", "skip", "rollback"]
SpikePolicy = Literal["off", "warn", "skip", "rollback"]
MonitorMode = Literal["min", "max"]
Switch = Literal["auto", "on", "off"]
Backend = Literal["auto", "nccl", "gloo"]
SamplerName = Literal["tpe", "random", "grid", "cmaes"]
PrunerName = Literal["median", "hyperband", "none"]

AMP_MODES: tuple[AmpMode, ...] = typing.get_args(AmpMode)
PREFETCH_MODES: tuple[PrefetchMode, ...] = typing.get_args(PrefetchMode)


def _meta(help: str, *, metavar: str | None = None, const: Any = None) -> dict[str, Any]:
    """A field's row of the table: its help line, and for `--opt [VALUE]` the bare value."""
    return {"help": help, "metavar": metavar, "const": const}


@dataclass(frozen=True)
class TrainOptions:
    """The options of one `%%train` run (`%%train --help` lists them with their help)."""

    amp: AmpMode = field(
        default="auto",
        metadata=_meta("mixed precision (auto: bf16 or fp16 on GPUs, off on the CPU)"),
    )
    device: str = field(
        default="auto",
        metadata=_meta("auto|cpu|cuda|cuda:N|mps (auto: where the model's parameters are)"),
    )
    accumulate: int = field(
        default=1, metadata=_meta("micro-batches per optimizer step", metavar="N")
    )
    clip: float | None = field(
        default=None, metadata=_meta("clip the gradient norm to MAX_NORM", metavar="MAX_NORM")
    )
    prefetch: PrefetchMode = field(
        default="auto",
        metadata=_meta(
            "move batches ahead of the step (auto: a side stream on CUDA; on the CPU a thread "
            "when loading draws no random numbers)"
        ),
    )
    tune_loader: int = field(
        default=0,
        metadata=_meta(
            "try DataLoader settings for N batches each on the first epoch, keep the fastest (0: off)",
            metavar="N",
            const=8,
        ),
    )
    checkpoint: str | None = field(
        default=None,
        metadata=_meta(
            "save checkpoints in DIR (bare: checkpoints/ beside the notebook)",
            metavar="DIR",
            const="",
        ),
    )
    every: int = field(
        default=0, metadata=_meta("checkpoint every N steps (0: at epoch ends only)", metavar="N")
    )
    keep: int = field(default=3, metadata=_meta("checkpoints to keep", metavar="K"))
    resume: bool = field(default=False, metadata=_meta("continue from the last checkpoint"))
    set: tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "with --resume: change an optimizer setting, e.g. --set lr=3e-4 (repeatable)",
            metavar="NAME=VALUE",
        ),
    )
    on_nan: NanPolicy = field(default="off", metadata=_meta("what to do on a non-finite loss"))
    on_spike: SpikePolicy = field(
        default="off", metadata=_meta("what to do on a gradient-norm spike")
    )
    spike_factor: float = field(
        default=10.0, metadata=_meta("a spike: X times the running median norm", metavar="X")
    )
    patience: int | None = field(
        default=None, metadata=_meta("early stopping: epochs without improvement", metavar="N")
    )
    monitor: str | None = field(
        default=None,
        metadata=_meta(
            "the metric (from log()) early stopping and --sweep watch; loss: the epoch's mean "
            "training loss",
            metavar="NAME",
        ),
    )
    mode: MonitorMode = field(default="min", metadata=_meta("which way --monitor improves"))
    display: DisplayMode = field(
        default="auto", metadata=_meta("the live display (auto: a widget in a notebook)")
    )
    tensorboard: Switch = field(
        default="auto",
        metadata=_meta("event files under runs/tensorboard/ (auto: when tensorboard is installed)"),
    )
    show: bool = field(
        default=False,
        metadata=_meta("print the code that would run and what was instrumented; do not run"),
    )
    # --- explain ---
    retries: int = field(
        default=0,
        metadata=_meta(
            "restart from the last checkpoint after a failure a restart can cure (a GPU fault, "
            "a killed DataLoader worker, an I/O error on the data), at most N times",
            metavar="N",
        ),
    )
    # --- lab ---
    notify_after: float | None = field(
        default=None,
        metadata=_meta(
            "JupyterLab toast when the run ends after more than SECONDS (default: the lab's "
            "setting, 60 s; 0: always)",
            metavar="SECONDS",
        ),
    )
    # --- procs ---
    procs: str | None = field(
        default=None,
        metadata=_meta(
            "run the cell data-parallel in N worker processes (gpus: one per visible GPU)",
            metavar="N|gpus",
        ),
    )
    backend: Backend = field(
        default="auto",
        metadata=_meta("with --procs: torch.distributed backend (auto: nccl with CUDA, else gloo)"),
    )
    # --- sweep ---
    sweep: int | None = field(
        default=None,
        metadata=_meta(
            "hyperparameter search: run the cell as N Optuna trials, maximising or minimising "
            "--monitor (see jupyter_trainmate.suggest and --space; with --resume: continue the study)",
            metavar="N",
        ),
    )
    sampler: SamplerName = field(
        default="tpe", metadata=_meta("with --sweep: how trials choose values (seeded by --seed)")
    )
    prune: PrunerName = field(
        default="median",
        metadata=_meta("with --sweep: end bad trials early at each log() of --monitor"),
    )
    study: str | None = field(
        default=None,
        metadata=_meta(
            "with --sweep: the study's name in runs/optuna.journal (default: notebook + cell)",
            metavar="NAME",
        ),
    )
    timeout: float | None = field(
        default=None,
        metadata=_meta("with --sweep: start no trial after S seconds", metavar="S"),
    )
    max_failures: int = field(
        default=3, metadata=_meta("with --sweep: stop after N failed trials in a row", metavar="N")
    )
    space: str | None = field(
        default=None,
        metadata=_meta(
            "with --sweep: search optimizer settings with no suggest() calls, e.g. "
            '"lr=1e-5..1e-2:log weight_decay=0..0.1 momentum=[0.8,0.9]"',
            metavar="SPACE",
        ),
    )
    seed: int | None = field(
        default=None, metadata=_meta("with --sweep: the sampler's seed", metavar="N")
    )
    # --- sweeppar ---
    parallel: int = field(
        default=1,
        metadata=_meta(
            "with --sweep: run K trials at a time in K worker processes (one GPU each where "
            "there are GPUs; the notebook's objects stay as they are)",
            metavar="K",
        ),
    )
    # --- noretry ---
    oom_retry: Switch = field(
        default="auto",
        metadata=_meta(
            "redo a step that runs out of memory as smaller micro batches (auto: only where "
            "an accelerator can raise torch.OutOfMemoryError; on: also on the CPU, for code "
            "that raises it itself; off: never, and no retry lines in the rewrite)"
        ),
    )

    def _check_parallel(self) -> None:
        if self.parallel < 1:
            raise TrainmateError(f"--parallel {self.parallel}: worker processes, 1 or more")
        if self.parallel > 1 and self.sweep is None:
            raise TrainmateError(f"--parallel {self.parallel}: only with --sweep N")
        if self.parallel > 1 and self.procs is not None:
            raise TrainmateError("--parallel and --procs together: not supported; use one")

    def __post_init__(self) -> None:
        for spec in _choice_specs():
            value = getattr(self, spec.name)
            if value not in spec.choices:
                raise TrainmateError(
                    f"{spec.flag} {value}: choose one of {', '.join(spec.choices)}"
                )
        if self.tune_loader < 0:
            raise TrainmateError(
                f"--tune-loader {self.tune_loader}: batches per setting, 1 or more"
            )
        if self.every < 0 or self.keep < 1:
            raise TrainmateError(
                f"--every {self.every} --keep {self.keep}: need every >= 0, keep >= 1"
            )
        if (self.every or (self.resume and self.sweep is None)) and self.checkpoint is None:
            raise TrainmateError("--every/--resume need --checkpoint DIR")
        for item in self.set:
            name, eq, value = item.partition("=")
            if not eq or not name.isidentifier():
                raise TrainmateError(f"--set {item}: write NAME=VALUE, e.g. --set lr=3e-4")
            try:
                float(value)
            except ValueError:
                raise TrainmateError(f"--set {item}: {value!r} is not a number") from None
        if self.set and not self.resume:
            raise TrainmateError("--set changes hyperparameters of a resumed run: add --resume")
        if not self.spike_factor > 1:
            raise TrainmateError(f"--spike-factor {self.spike_factor}: must be more than 1")
        if (self.patience is None) != (self.monitor is None) and self.sweep is None:
            raise TrainmateError("--patience and --monitor go together")
        if self.patience is not None and self.patience < 1:
            raise TrainmateError(f"--patience {self.patience}: must be 1 or more")
        if self.accumulate < 1:
            raise TrainmateError(f"--accumulate {self.accumulate}: must be 1 or more")
        if self.clip is not None and not self.clip > 0:
            raise TrainmateError(f"--clip {self.clip}: must be a positive max norm")
        if self.procs not in (None, "gpus") and not (self.procs.isdigit() and int(self.procs) > 0):
            raise TrainmateError(f"--procs {self.procs}: a number of processes (1 or more) or gpus")
        if self.procs is None and self.backend != "auto":
            raise TrainmateError(f"--backend {self.backend}: only with --procs N")
        if self.procs is not None and self.retries:
            raise TrainmateError(
                "--procs and --retries together: not supported (a restart in one worker would "
                "leave the others waiting in their collectives); use one"
            )
        if self.procs is not None and self.on_nan in ("skip", "rollback"):
            raise TrainmateError(
                f"--procs and --on-nan {self.on_nan} together: not supported (a NaN in one "
                "worker's loss would skip its backward alone, out of step with the others' "
                "all-reduce); use --on-nan stop"
            )
        self._check_sweep()
        self._check_parallel()
        if self.device != "auto":
            import torch  # only here: the table itself is read at import time

            try:
                torch.device(self.device)
            except RuntimeError:
                raise TrainmateError(
                    f"--device {self.device}: not a device (auto, cpu, cuda, cuda:N, mps)"
                ) from None
        if self.retries < 0 or (self.retries and self.checkpoint is None):
            raise TrainmateError(
                f"--retries {self.retries}: restarts resume from a checkpoint; add --checkpoint"
                if self.retries > 0
                else f"--retries {self.retries}: must be 0 or more"
            )

    def _check_sweep(self) -> None:
        """The sweep options (values: only with --sweep N), and --sweep needs --monitor (the objective)."""
        if self.sweep is None:
            given = [
                flag
                for flag, value, default in (
                    ("--study", self.study, None),
                    ("--timeout", self.timeout, None),
                    ("--space", self.space, None),
                    ("--seed", self.seed, None),
                    ("--max-failures", self.max_failures, 3),
                    ("--sampler", self.sampler, "tpe"),
                    ("--prune", self.prune, "median"),
                )
                if value != default
            ]
            if given:
                raise TrainmateError(f"{', '.join(given)}: only with --sweep N")
            return
        if self.sweep < 1:
            raise TrainmateError(f"--sweep {self.sweep}: trials, 1 or more")
        if self.monitor is None:
            raise TrainmateError(
                f"--sweep {self.sweep}: name the metric to optimise with --monitor NAME "
                "(reported by jupyter_trainmate.log(NAME=value)) and --mode min|max"
            )
        if self.max_failures < 1:
            raise TrainmateError(f"--max-failures {self.max_failures}: must be 1 or more")
        if self.timeout is not None and not self.timeout > 0:
            raise TrainmateError(f"--timeout {self.timeout}: seconds, more than 0")
        if self.set:
            raise TrainmateError("--set changes a resumed run; a sweep sets values with --space")


@dataclass(frozen=True)
class OptionSpec:
    """One row of the table, as the parser and the docs read it."""

    name: str  # the TrainOptions field
    kind: Literal["choice", "flag", "repeat", "value"]
    type: type  # of one value: str, int or float
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    const: Any = None  # `--opt` given without a value

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def shows_no_default(self) -> bool:
        """Off by default (no value, a flag not given, nothing repeated): no default to state."""
        return self.default is None or self.default is False or self.default == ()

    @property
    def help_line(self) -> str:
        return self.help if self.shows_no_default else f"{self.help} (default {self.default})"


@cache
def option_specs() -> tuple[OptionSpec, ...]:
    """The rows of the table, in field order, from the field types and metadata."""
    hints = typing.get_type_hints(TrainOptions)
    specs = []
    for f in dataclasses.fields(TrainOptions):
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        meta = f.metadata
        common = {"name": f.name, "default": f.default, "help": meta["help"]}
        if typing.get_origin(hint) is Literal:
            spec = OptionSpec(kind="choice", type=str, choices=typing.get_args(hint), **common)
        elif hint is bool:
            spec = OptionSpec(kind="flag", type=bool, **common)
        elif typing.get_origin(hint) is tuple:
            spec = OptionSpec(kind="repeat", type=args[0], metavar=meta["metavar"], **common)
        else:
            value_type = args[0] if args else hint
            spec = OptionSpec(
                kind="value",
                type=value_type,
                metavar=meta["metavar"],
                const=meta["const"],
                **common,
            )
        specs.append(spec)
    return tuple(specs)


@cache
def _choice_specs() -> tuple[OptionSpec, ...]:
    """The options with a fixed set of values, which every `TrainOptions` checks."""
    return tuple(spec for spec in option_specs() if spec.choices)


class HelpShown(Exception):
    """`--help` was given: the help has been printed, nothing is to run."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting: the magic turns errors into `UsageError`."""

    def error(self, message: str) -> NoReturn:
        raise TrainmateError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            raise TrainmateError(message.strip())
        raise HelpShown


@cache
def build_parser(prog: str = "%%train") -> argparse.ArgumentParser:
    """The option parser, derived from the table."""
    parser = _Parser(
        prog=prog,
        description="Run an ordinary PyTorch training loop instrumented.",
        allow_abbrev=False,
    )
    for spec in option_specs():
        if spec.kind == "flag":
            parser.add_argument(spec.flag, action="store_true", help=spec.help)
        elif spec.kind == "choice":
            parser.add_argument(
                spec.flag,
                default=spec.default,
                metavar="|".join(spec.choices),
                help=spec.help_line,
            )
        elif spec.kind == "repeat":
            parser.add_argument(
                spec.flag, action="append", default=[], metavar=spec.metavar, help=spec.help
            )
        else:
            extra: dict[str, Any] = {"nargs": "?", "const": spec.const}
            parser.add_argument(
                spec.flag,
                type=spec.type,
                default=spec.default,
                metavar=spec.metavar,
                help=spec.help_line,
                **(extra if spec.const is not None else {}),
            )
    return parser


def parse_options(line: str, checkpoint_base: Path | None = None) -> TrainOptions:
    """`%%train`'s option line as `TrainOptions`: a bad line is a one-line `TrainmateError`.

    A bare `--checkpoint` means `checkpoints/` in `checkpoint_base` (the notebook's folder; the
    working directory when None). `--help` prints the help and raises `HelpShown`.
    """
    options = _parse_line(line)
    if options.checkpoint == "":
        checkpoint = str((checkpoint_base or Path.cwd()) / "checkpoints")
        return dataclasses.replace(options, checkpoint=checkpoint)
    return options


@lru_cache(maxsize=64)
def _parse_line(line: str) -> TrainOptions:
    """The line parsed once: argparse costs a run about 0.1 ms, and a re-run of a cell has the
    same line. `TrainOptions` is frozen; errors and `--help` raise, so they are never cached."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise TrainmateError(f"{line}: {exc}") from None
    args = build_parser().parse_args(words)
    values = {spec.name: getattr(args, spec.name) for spec in option_specs()}
    values["set"] = tuple(values["set"])
    return TrainOptions(**values)


def options_markdown() -> str:
    """The options as a Markdown table, for the user guide."""
    rows = ["| option | default | what it does |", "|---|---|---|"]
    for spec in option_specs():
        if spec.kind == "flag":
            flag = spec.flag
        elif spec.kind == "choice":
            flag = spec.flag + " " + "\\|".join(spec.choices)  # a pipe would end the cell
        elif spec.const is not None:
            flag = f"{spec.flag} [{spec.metavar}]"
        else:
            flag = f"{spec.flag} {spec.metavar or spec.name.upper()}"
        default = "" if spec.shows_no_default else f"`{spec.default}`"
        text = spec.help.replace("|", "\\|")
        rows.append(f"| `{flag}` | {default} | {text} |")
    return "\n".join(rows)
