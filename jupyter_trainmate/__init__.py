"""
Train PyTorch models in Jupyter: fast, observable and clean enough to ship.

This page is the user guide; [the how-to pages](howto.html) answer the first hour's questions
(which option when, what `--show` says, troubleshooting), from `docs/howto.md` in the repository.

## `%%train`: your loop, instrumented

```python
%load_ext jupyter_trainmate
```

```python
%%train
for epoch in range(5):
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        scheduler.step()
```

The cell runs as written, with every batch timed (data wait against compute), mixed precision
and device prefetching chosen for the device, and a summary at the end; `jupyter_trainmate.last_run()`
returns it (steps, optimizer steps, epochs, samples, wall time, data-wait share, AMP mode, skipped
steps, and what was instrumented or left alone and why).

While it runs, a live widget in the cell output shows progress over epochs and steps with ETA,
the loss curve and every metric the cell reports with `jupyter_trainmate.log(val_acc=...)`,
samples/s and steps/s, the share of step time spent waiting for data, GPU utilisation and memory
(NVML) or CPU and process memory (psutil, within container limits), the AMP state, events, and
advice computed from these measurements (for example "35% of step time waits for data:
num_workers=0: raise it (this machine has 16 CPUs)"). The widget is redrawn a few times a second
by a background thread, never by the training loop; the final state stays in the saved notebook as
a static picture. Without a widget front end (terminal IPython, logs) a compact text line is
printed every 10 s instead (`--display auto|widget|text|off`).

`--tune-loader [N]` tries a few DataLoader settings (num_workers, pin_memory) on the first epoch's
own batches, N per setting, reports the speed-up of each and keeps the fastest: the batches and
their order are exactly the plain loop's.

Runs survive: `--checkpoint [DIR]` (default `checkpoints/` beside the notebook) saves every
model, optimizer, scheduler and GradScaler the notebook holds, the random generators and the
position in the loader at each epoch's end, every `--every N` steps (keeping `--keep K`), and on
Ctrl-C or an exception; `%%train --checkpoint DIR --resume` (the same cell run again) continues
mid-epoch without repeating or skipping a batch, bit-identically on a CPU (and on a GPU with
deterministic algorithms), with `--accumulate` too (the gradients summed so far in an unfinished
window travel in the checkpoint); add `--set lr=3e-4` to continue with changed optimizer
settings. The states are copied on the training thread, then written atomically (temporary file,
fsync, rename) by a low-priority background thread; loads use `torch.load(weights_only=True)`.

Out of memory (`torch.OutOfMemoryError`) in a step is recovered: the failed attempt's frames,
its variables that hold an autograd graph and every gradient are dropped, the CUDA cache is
emptied, and the step is redone as 2, 4, 8, ... micro-batches whose losses are weighted by their
share of the batch, so the effective batch size and, for a mean-reduced loss, the gradient stay
the same (BatchNorm sees the smaller batches). The split that worked is kept for the rest of the
run, the run's events say what happened, and below one sample per micro-batch the run stops with
a one-line message. The loop body then runs once per micro-batch, so counters in it count
micro-batches; inside an unfinished `--accumulate` window a step cannot be redone (the summed
gradients cannot be told apart) and the error is raised as it was. `--on-nan
stop|skip|rollback` guards against non-finite losses (`stop` reads device flags every 16 steps, so
it may notice up to 16 steps late, and names the step); `--on-spike warn|skip|rollback` does the
same for gradient norms over `--spike-factor` (10) times their running median; `--patience N --monitor NAME --mode
min|max` stops early on metrics reported with `jupyter_trainmate.log()`. Every run appends a
record to `runs/runs.jsonl` beside the notebook; `trainmate runs` (or `%trainmate runs`) shows
them, `trainmate runs --markdown README.md` keeps a table of them in a Markdown file. With the
`tensorboard` package installed, each run also writes TensorBoard event files (loss, samples/s,
data-wait share about once a second from the display thread, and the logged metrics at their
steps) to `runs/tensorboard/<time>-<run>/` (`--tensorboard auto|on|off`). `trainmate report`
(or `%trainmate report`) writes the records as one self-contained HTML file (`--markdown`: a
Markdown file and SVG charts) with the differing parameters, curves, advice and sweeps; with
`TRAINMATE_NOTIFY_URL` set, the Jupyter server posts to that webhook when a long run ends.

Options (the full table is at the end of this page; `%%train --help` prints it too):
`--amp`, `--device`, `--accumulate N`, `--clip MAX_NORM`, `--prefetch`, and `--show`, which
prints the code that would run and what was instrumented, without running it.

How it works: the cell is rewritten with libcst. The innermost loop that calls `.backward()` over
something other than a `range` gets its iterable wrapped (`enumerate` and `tqdm` stay outside); a
training loop over a `range` (or over a list of models) outside any batch loop is watched too, and
the session learns as it runs whether its passes are steps (a loop that draws its own data) or
epochs (a batch loop runs inside it, also in a function it calls). A step is a batch during which a
`backward()` or an optimizer step happened, so validation batches, even through the same
`run_epoch()`, are neither steps nor epochs; samples come from the DataLoader's batch size and
sampler, else from the first dimension of each batch, and the summary then says the count is a
guess. `backward()`, `step()`, `zero_grad()` and `clip_grad_norm_()` (and its deprecated
`clip_grad_norm()`) go through the run's session, which passes through anything that is not an
optimizer, scheduler or module (`env.step(a)` stays `env.step(a)`). Notebook functions the cell
calls or passes on (`train_epoch()` defined cells earlier) and methods of notebook classes it
reaches (`trainer.fit()`, and what that calls on `self`) are rewritten for the cell's duration, a
method swapped on its class; `%time`/`%%time` lines are rewritten inside. Code in imported modules
is not (`--show` names it), but a global optimizer hook still counts its steps, and autocast is on
for the whole cell, so it reaches code the rewrite cannot see; where code reads gradients the
session cannot unscale first (`p.grad`), fp16 and its GradScaler are refused. Everything is undone
when the cell ends, however it ends. Where an accelerator can run out of memory (`--oom-retry
auto`; `on`/`off` choose), the body of each batch loop is wrapped in a retry point for
out-of-memory errors (the only lines the rewrite adds, marked `# %%train oom-retry` in `--show`);
on the CPU alone none is added, so a step pays for no generator or second loop. Positions are
mapped back when the code is compiled, so a traceback shows the user's own line and column.

Guarantees: on the CPU with the defaults, the same seed gives bit-identical weights with and
without `%%train` (shuffling and dropout included). `--prefetch thread` overlaps data loading with
compute on the CPU (0.98 of the overlap bound on an input-bound loop, BENCHMARKS.md) but is
opt-in: a dataset that draws random numbers while the model does (dropout) would then draw them in
another order. A cell that brings its own autocast or GradScaler gets none added; `--accumulate`
is refused on a loop that already accumulates by hand.

## `trainmate doctor`: the checks before a long run

```console
$ trainmate doctor                        # Python, torch, CUDA, GPUs, TF32, pip check, /dev/shm, ...
$ trainmate doctor --json --data ./data   # ... plus file system, disk kind and read speed of ./data
```

Also `%trainmate doctor` in a notebook. Exit status 0 when no check fails. A machine with no GPU,
or no NVIDIA driver, is a normal answer, not an error.

## `trainmate refactor`: the notebook as a package

```console
$ trainmate refactor train.ipynb -o train_pkg       # --name, --force, --dry-run, --skip-bad-cells
$ trainmate refactor train.ipynb -o train_pkg --execute --check-equivalence   # + traced types
$ cd train_pkg && pip install -e . && python -m train_pkg train --epochs 3 --lr 1e-3
```

The notebook is read with nbformat (any version) and never modified. Magics and shell lines are
classified by IPython's own input transformers: `!pip install x` becomes a dependency,
`%matplotlib` and friends are dropped, `%time`/`%%time` keep their code, `%%writefile` files are
written beside the package, `x = !cmd` becomes `subprocess.run(...)` with a warning, a `%%train`
cell becomes a function run by `jupyter_trainmate.train()` (the same runtime as the magic), and
anything else is commented out and reported. Definitions go to `data`, `model`, `train` or
`utils` by what they are (an `nn.Module`, a `Dataset`, a function that calls `.backward()`) and the
markdown heading above them; a cell tag `trainmate:module=NAME` or nbdev's `#| default_exp`
overrides, and with nbdev markers only `#| export` cells are taken. Constants become the fields of a
typed `Config` dataclass and options of the package's CLI (in lower case, `LR` as `--lr`, unless
that is another constant's name: `gamma` and `GAMMA` stay two); a function that reads a notebook
global gets it as a keyword-only parameter (constants with their value as default), and every call
site passes it, those that unpack `*args` or `**kwargs` too. `train.run(config)` is the notebook's
top-level code in order, so importing any module runs nothing. `.cuda()` and `"cuda:N"` become a
`device` option (`auto` by default), so the package runs on a CPU. The output is ruff-formatted,
passes `ruff check`, is the same byte for byte on every run, and is written atomically (an existing
folder only with `--force`). `REFACTOR_REPORT.md` lists every cell and where it went, every
parameter created, and everything dropped, commented out, skipped or redefined (the last definition
wins).

Types, tests, docs: annotations are inferred statically through the package's dataflow (constructors
such as `model = Net()`, `DataLoader(...)`, optimizers, `nn.*` layers, tensors from `torch.*`
factories, numpy arrays, pandas frames; every call site of a function, joined to the nearest common
base, or for up to three of the package's own models to their union; returns from what is returned;
a small table of torch/numpy/pandas calls) and, with `--execute`, from a run of the notebook in a
fresh temporary folder that holds a copy of the files beside the notebook, its data (nbclient,
`--timeout`, random generators seeded) that records each function's argument and return types and
tensor dtypes, shapes and integer ranges; shapes go into docstrings. mypy then checks the package (a
few rounds: each confirms the last one's edits): an annotation it rejects is removed, only a
function whose own code fails gets `@no_type_check`, and a method that sets attributes loses its
inferred annotations instead, so that the methods reading them are still checked; the report gives
the annotated share, mypy's verdict and each `@no_type_check` with its reason. Generated pytest
tests (in `tests/`): every module imports; with
`--execute`, each model runs `forward` on inputs of the recorded shapes and one training step,
each dataset gives its recorded length and item structure, and functions that drew no random
numbers get characterisation tests from recorded fixtures; what could not be generated soundly
is listed with the reason. Docstrings come from the markdown above each definition, pdoc renders
`docs/`, `MODEL_CARD.md` gathers use, data, hyperparameters and recorded metrics.
`--execute --check-equivalence` runs the package's `run(Config())` and compares the numbers the
notebook ended with (relative tolerance 1e-4): exit 2 when they differ.

## `export()` and `bench()`: ready to deploy

```python
report = jupyter_trainmate.export(model, xb, "model.onnx", quantize="int8")
table = jupyter_trainmate.bench(model, xb, batch_sizes=(1, 8, 32))
```

Also `%trainmate export model xb -o model.onnx [--quantize int8]` and `%trainmate bench model xb`
in a notebook, and in a shell, on a `%%train` checkpoint and a package written by
`trainmate refactor`: `trainmate export ckpt/step-....pt --model PKG.model:Net --example 1,3,32,32
-o model.onnx` (`--example SHAPE[:DTYPE]` once per input), `trainmate bench model.onnx --example
1,3,32,32`. Both need `pip install 'jupyter_trainmate[export]'` (onnx, onnxscript, onnxruntime).

`export()` tries torch's dynamo exporter, then the same on the example repeated to batch 2, then
the TorchScript exporter, and says which worked and each failed one's first error line; an
operator no exporter supports is a one-line error naming it. The batch axis is dynamic, the
model is one `.onnx` file (under 2 GB), and onnxruntime then runs the example and random inputs
at batch sizes 1, 3 and 8 against the model in eval mode: per output the largest absolute and
relative differences, passed at `|onnx - torch| <= 1e-5 + 1e-4 * |torch|`, else FAILED with the
worst element. `quantize="int8"` adds onnxruntime's dynamic quantisation of MatMul/Gemm
(convolutions stay float; 7-bit weights, which x86 CPUs without VNNI need to avoid
saturation), the sizes before and after, and its differences from the float
model; `validate=(loader, metric)` scores both. The files appear only once all of that is done
(written in a staging folder, then moved), with the `ExportReport` as `model.export.json`.

`bench()` times eager PyTorch, `torch.compile` and onnxruntime per precision (bf16 and fp16
where the device has them; skipped rows say why) and batch size, in eval mode and
`torch.inference_mode`, after a warm-up, with `torch.utils.benchmark.Timer`, the rows
interleaved in rounds: p50/p95/p99 latency (each round weighing the same), samples/s, peak
memory (RSS on a CPU, the CUDA allocator's on a GPU), the compile time apart, and the graphs
compiled inside the timed region (0, or the row is marked); onnxruntime with I/O binding.
`--clock cpu` times the calling thread's CPU time on one thread: steadier on a busy machine. The
table ends with the fastest configuration at each batch size. Both reports are also appended to
`runs/runs.jsonl` with the run that trained the model, and an export of a refactored package's
checkpoint updates its `MODEL_CARD.md` (docs/deploy.md).

## In JupyterLab

The package ships a prebuilt JupyterLab 4 extension (a sidebar panel) and a Jupyter server
extension; installing the wheel enables both, with no Node.js needed.

Importing this package is cheap: torch, tornado and libcst are imported only when used, so
`%load_ext jupyter_trainmate` does not slow a kernel's start.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ._version import __version__
from .errors import NanDetected, TrainmateError
from .explain.kinds import Explanation
from .runtime.options import TrainOptions, options_markdown
from .runtime.summary import RunSummary, last_run
from .sweep.summary import SweepSummary

# The option table of `%%train`, from its one definition (`runtime/options.py`).
__doc__ = f"{__doc__}\n## `%%train` options\n\n{options_markdown()}\n"

T = TypeVar("T")


def log(**values: float) -> None:
    """Report metrics from a `%%train` cell: `jupyter_trainmate.log(val_loss=0.31, acc=0.9)`.

    They feed the live chart and the run's summary (`last_run().metrics`). Outside a run, nothing.
    """
    from .runtime.session import log as _log

    _log(**values)


if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell
    from jupyter_server.serverapp import ServerApp

    from .deploy.bench_report import BenchReport
    from .deploy.report import ExportReport

# The public API: what a user calls or catches. Everything else is internal (the subpackages are
# documented for contributors; docs/ARCHITECTURE.md maps them).
__all__ = [
    "Explanation",
    "NanDetected",
    "RunSummary",
    "SweepSummary",
    "TrainOptions",
    "TrainmateError",
    "__version__",
    "bench",
    "export",
    "last_run",
    "last_sweep",
    "load_ipython_extension",
    "log",
    "suggest",
    "train",
]


def train(fn: Callable[..., T], options: str = "", /, **kwargs: Any) -> T:
    """Run `fn(**kwargs)` as `%%train OPTIONS` runs a cell calling it, in or out of a notebook.

    See `jupyter_trainmate.runner.train`; `trainmate refactor` turns `%%train` cells into calls of it.
    With `--sweep N` it runs the study of `%%train --sweep N` over `fn` (`sweep/function.py`).
    """
    from .runner import train_call
    from .sweep.function import hooks

    return train_call(fn, options, kwargs, hooks())


def export(
    model: Any,
    example: Any,
    path: str | os.PathLike[str] = "model.onnx",
    *,
    dynamic_batch: bool = True,
    quantize: str | None = None,
    validate: tuple[Any, Callable[..., float]] | None = None,
    opset: int | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    record: bool = True,
) -> ExportReport:
    """Export `model` to ONNX at `path`, checked in onnxruntime: `export(model, xb)`.

    `example` is what the model is called with (a tensor, a tuple of inputs, or a dict). The
    dynamo exporter is tried first, then with the example repeated to batch 2, then the
    TorchScript exporter; the batch axis is dynamic unless `dynamic_batch=False`. onnxruntime
    (CPU) then runs the example and random inputs at batch sizes 1, 3 and 8 and every output is
    compared with the model's in eval mode (`|onnx - torch| <= atol + rtol * |torch|`).
    `quantize="int8"` also writes `MODEL.int8.onnx` (dynamic quantisation of MatMul/Gemm) and
    compares it with the float model; `validate=(loader, metric)` scores both on the loader's
    `(inputs, target)` batches. Everything is written atomically, with the report as
    `MODEL.export.json`. Returns the `ExportReport` (a table in the notebook; `.passed`).
    With `record`, the report is also appended to `runs/runs.jsonl` as a line referring to the
    notebook's latest `%%train` run (none: nothing is written). Needs `pip install
    'jupyter_trainmate[export]'`.
    """
    from .deploy.attach import attach, current_notebook
    from .deploy.export import export as _export

    report = _export(
        model,
        example,
        path,
        dynamic_batch=dynamic_batch,
        quantize=quantize,
        validate=validate,
        opset=opset,
        rtol=rtol,
        atol=atol,
    )
    if record:
        attach("export", report, notebook=current_notebook())
    return report


def bench(
    model: Any,
    example: Any,
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    precision: Sequence[str] = ("fp32", "bf16"),
    backends: Sequence[str] = ("eager", "compile", "onnxruntime"),
    min_run_time: float = 0.5,
    threads: int | None = None,
    rounds: int = 5,
    clock: str = "wall",
    record: bool = True,
) -> BenchReport:
    """Inference latency and throughput of `model` at each batch size: `bench(model, xb)`.

    Rows per backend (`eager`, `compile`, `onnxruntime`), precision (`fp32`, `bf16`, `fp16`
    where the device has it; skipped rows say why) and batch size (the example's rows
    repeated): p50/p95/p99 latency, samples/s, peak memory, torch.compile's compile time and the
    graphs compiled inside the timed region (0, or the row is marked). Measured with
    `torch.utils.benchmark.Timer` (`min_run_time` seconds per row, the rows interleaved in
    `rounds` rounds; each round weighs the same in p50/p95/p99) after a warm-up, in eval mode and
    `torch.inference_mode`, on `threads` CPU threads. `clock="cpu"` times the calling thread's
    CPU time on one thread instead of the wall clock: steadier on a busy machine, since it leaves
    out the time spent waiting for a core (not a latency a caller sees there). Returns the
    `BenchReport` (a table in the notebook, a verdict per batch size; `.to_markdown()`,
    `.to_json()`). With `record`, the table is also appended to `runs/runs.jsonl` as a line
    referring to the notebook's latest `%%train` run (none: nothing is written).
    """
    from .deploy.attach import attach, current_notebook
    from .deploy.bench import bench as _bench

    report = _bench(
        model,
        example,
        batch_sizes=batch_sizes,
        precision=precision,
        backends=backends,
        min_run_time=min_run_time,
        threads=threads,
        rounds=rounds,
        clock=clock,
    )
    if record:
        attach("bench", report, notebook=current_notebook())
    return report


def suggest(
    name: str,
    low: Any,
    high: float | None = None,
    *,
    log: bool = False,
    step: float | None = None,
    default: Any = None,
) -> Any:
    """A hyperparameter for `%%train --sweep N`: `suggest("lr", 1e-4, 1e-1, log=True)`,
    `suggest("width", [128, 256])` (an int when both bounds are ints).

    In a sweep the trial chooses; outside one it returns `default`, else the middle of the range
    (geometric with `log=True`) or the first choice, so the cell runs unchanged. See docs/sweeps.md.
    """
    from .sweep.suggest import suggest as _suggest

    return _suggest(name, low, high, log=log, step=step, default=default)


def last_sweep() -> SweepSummary | None:
    """The summary of the latest `%%train --sweep` in this process: `best_params`, `best_value`,
    `best_trial` and `trials` (number, params, value, state, duration), or None before the first."""
    from .sweep.summary import last_sweep as _last_sweep

    return _last_sweep()


def load_ipython_extension(ip: InteractiveShell) -> None:
    """Register the trainmate magics (`%load_ext jupyter_trainmate`)."""
    from .magic import TrainmateMagics

    ip.register_magics(TrainmateMagics)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-trainmate"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_trainmate"}]


def _load_jupyter_server_extension(server_app: ServerApp) -> None:
    from .server import load_server_extension

    load_server_extension(server_app)
