"""
The message, cause and fixes of each kind, from the exception's message and the frames' facts.

Each builder returns `(message, cause, advice)`. Fixes come most likely first and name the
`%%train` option that applies; a figure is only stated when it was measured or read from the
message, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .facts import Facts, TensorFact
from .kinds import ErrorKind
from .memory import size

Built = tuple[str, str, tuple[str, ...]]
Builder = Callable[[str, Facts, Mapping[str, Any]], Built]

RELAUNCH = (
    "rerun with CUDA_LAUNCH_BLOCKING=1 (set it before torch starts CUDA: "
    "`%env CUDA_LAUNCH_BLOCKING=1` after restarting the kernel) so the traceback points at the "
    "failing operation, or run one step on the CPU, where the error is reported in plain words"
)


def first_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _where(facts: Facts) -> str:
    return f" at {facts.user_line}" if facts.user_line else ""


def _listing(tensors: tuple[TensorFact, ...], limit: int = 4) -> str:
    return "; ".join(t.describe() for t in tensors[:limit])


def _batch_advice(facts: Facts) -> str:
    if facts.batch_size and facts.batch_size >= 2:
        half = facts.batch_size // 2
        return (
            f"`%%train --accumulate 2` with batch_size={half} (now {facts.batch_size}) keeps the "
            "effective batch and halves the activations"
        )
    return "`%%train --accumulate N` with a batch N times smaller keeps the effective batch"


def out_of_memory(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    figures: Mapping[str, int] = extra.get("memory", {})
    parts = []
    if "requested" in figures:
        parts.append(f"tried to allocate {size(figures['requested'])}")
    if "free" in figures and "total" in figures:
        parts.append(f"{size(figures['free'])} free of {size(figures['total'])}")
    held = [
        f"{key} {size(figures[key])}"
        for key in ("parameters", "gradients", "optimizer state", "activations", "cache")
        if figures.get(key)
    ]
    if held:
        parts.append("held: " + ", ".join(held))
    if facts.batch_size:
        parts.append(f"batch size {facts.batch_size}")
    advice = [_batch_advice(facts)]
    amp = str(extra.get("amp", ""))
    if amp in ("", "off", "auto"):
        advice.append(
            "`%%train --amp bf16` (or fp16 on GPUs without bf16) halves activation memory"
        )
    advice.append("a smaller batch_size in the DataLoader")
    if figures.get("cache", 0) > figures.get("requested", 1):
        advice.append(
            f"{size(figures['cache'])} is cached but unallocated: set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch starts"
        )
    advice.append(
        "free what other kernels hold on this GPU (the sidebar lists them) and delete tensors "
        "kept from earlier cells (`del`, then torch.cuda.empty_cache())"
    )
    return "the device ran out of memory" + _where(facts), "; ".join(parts), tuple(advice)


def device_mismatch(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    devices = re.findall(r"\b(cuda:\d+|cuda|cpu|mps)\b", message)
    tensors = facts.tensors()
    by_device: dict[str, list[str]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t.name)
    cause = "; ".join(f"on {d}: {', '.join(names[:5])}" for d, names in by_device.items())
    if facts.layer and facts.layer_input is not None:
        cause += f"; layer {facts.layer_name or facts.layer} got {facts.layer_input.describe()}"
    if not cause and devices:
        cause = f"tensors on {' and '.join(dict.fromkeys(devices))}"
    target = next((d for d in devices if d.startswith("cuda")), "the model's device")
    advice = (
        f"move the batch where the model is: `xb, yb = xb.to({target!r}), yb.to({target!r})` "
        "(or let `%%train --prefetch auto` move batches: it does so when the model is on a GPU)",
        "move the model once, before building the optimizer: `model.to(device)`",
        "tensors made inside forward() need `device=x.device` (torch.zeros(..., device=x.device))",
    )
    return "tensors on different devices met in one operation" + _where(facts), cause, advice


def dtype_mismatch(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    tensors = facts.tensors()
    cause = _listing(tensors)
    call = facts.call or ""
    advice: list[str] = []
    ints = [t for t in tensors if t.dtype.startswith(("int", "uint", "bool"))]
    floats = [t for t in tensors if t.dtype.startswith(("float", "bfloat"))]
    loss_wants_float = any(n in call for n in ("mse", "l1", "smooth", "huber", "binary", "bce"))
    loss_wants_long = any(n in call for n in ("cross_entropy", "nll"))
    if ints and (loss_wants_float or "Float" in message.split("expected")[-1][:30]):
        advice.append(
            f"{call or 'this loss'} needs float targets: `{ints[-1].name}.float()` "
            "(and the same shape as the output)"
        )
    if loss_wants_long or re.search(
        r"expected scalar type Long|Long but|to be Long|nll_loss", message
    ):
        target = next((t for t in floats if t.name in ("target", "y", "yb", "labels")), None)
        advice.append(
            "cross_entropy/nll_loss take class indices as int64: "
            f"`{(target.name if target else 'target')}.long()` (or probabilities of the output's "
            "shape as float)"
        )
    if re.search(r"Half|BFloat16|bfloat16|float16", message) or any(
        t.dtype in ("float16", "bfloat16") for t in tensors
    ):
        advice.append(
            "mixed precision by hand (`.half()`) leaves some tensors in float32: drop the casts "
            "and use `%%train --amp bf16` (autocast chooses per operation)"
        )
    advice.append("make the dtypes agree where the tensors are made (the Dataset or the model)")
    return (
        "tensors of different dtypes met in one operation" + _where(facts),
        cause,
        tuple(dict.fromkeys(advice)),
    )


def shape_mismatch(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    parts = []
    advice: list[str] = []
    if facts.layer and facts.layer_input is not None:
        name = facts.layer_name or "the layer"
        parts.append(f"{name} = {facts.layer} got {facts.layer_input.describe()}")
        features = re.search(r"in_features=(\d+)", facts.layer)
        if features and facts.layer_input.shape:
            got = facts.layer_input.shape[-1]
            advice.append(
                f"{name} expects {features.group(1)} features and gets {got}: "
                f"make it nn.Linear({got}, ...) (or nn.LazyLinear), or reshape the input "
                "(a missing flatten: `x.flatten(1)`)"
            )
        channels = re.search(r"Conv\d?d\((\d+),", facts.layer)
        if channels:
            advice.append(
                f"{name} expects {channels.group(1)} input channels and a batch dimension "
                "first: (batch, channels, height, width)"
            )
    mat = re.search(r"\((\d+)x(\d+) and (\d+)x(\d+)\)", message)
    if mat and not advice:
        advice.append(
            f"the input has {mat.group(2)} features where the layer expects {mat.group(3)}: "
            "change the layer's in_features or reshape the input"
        )
    batches = re.search(r"input batch_size \((\d+)\) to match target batch_size \((\d+)\)", message)
    if batches:
        advice.append(
            f"the output has {batches.group(1)} rows and the target {batches.group(2)}: check "
            "view()/reshape() calls before the loss and that the labels come from the same batch"
        )
    if facts.call and facts.call_tensors and (not facts.layer or "forward" not in facts.call):
        parts.append(f"in {facts.call}: {_listing(facts.call_tensors)}")
    if not parts and facts.user_tensors:
        parts.append(_listing(facts.user_tensors))
    if facts.batch_size:
        parts.append(f"batch size {facts.batch_size}")
    if re.search(r"must match the size of tensor b", message):
        advice.append(
            "two tensors of different sizes were combined elementwise (a loss on (N, 1) against "
            "(N,) broadcasts, too): `out.squeeze(-1)` or `target.view_as(out)`"
        )
    advice.append("print the shapes along forward() for one batch: `%%train --show` lists the code")
    return "shapes do not fit" + _where(facts), "; ".join(parts), tuple(dict.fromkeys(advice))


def index_out_of_range(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    parts: list[str] = []
    advice: list[str] = []
    target = re.search(r"Target (-?\d+) is out of bounds", message)
    ints = [t for t in facts.tensors() if t.dtype.startswith("int") and t.high is not None]
    floats = [t for t in facts.call_tensors if t.dtype.startswith(("float", "bfloat")) and t.shape]
    if facts.layer and "Embedding" in facts.layer:
        rows = re.search(r"Embedding\((\d+),", facts.layer)
        idx = facts.layer_input
        if rows and idx is not None:
            parts.append(
                f"{facts.layer_name or 'the embedding'} = {facts.layer} has {rows.group(1)} rows; "
                f"got {idx.describe()}"
            )
            high = f"{idx.high:g}" if idx.high is not None else "an index"
            advice.append(
                f"indices must be in [0, {rows.group(1)}): {high} is not — make num_embeddings "
                f"at least {int(idx.high) + 1 if idx.high is not None else 'max index + 1'} "
                "(the vocabulary size, padding and special tokens included)"
            )
    elif target or (facts.call and ("cross_entropy" in facts.call or "nll" in facts.call)):
        classes = floats[0].shape[1] if floats and len(floats[0].shape) > 1 else None
        labels = next((t for t in ints), None)
        if classes is not None:
            parts.append(f"the output has {classes} classes")
        if labels is not None:
            parts.append(f"{labels.describe()}")
        bad = target.group(1) if target else (f"{labels.high:g}" if labels else "a target")
        advice.append(
            f"targets must be class indices in [0, {classes if classes else 'C'}): {bad} is "
            "not — give the last layer as many outputs as there are classes, or remap the labels "
            "(1-based labels: `y - 1`)"
        )
    if "device-side assert" in message or "srcIndex" in message or "n_classes" in message:
        advice.append(RELAUNCH)
        if not parts:
            parts.append(
                "a device-side assert is most often an index out of range: a class target >= "
                "the number of outputs, or a token id >= the embedding's rows"
            )
    if not parts and ints:
        parts.append(_listing(tuple(ints)))
    advice.append("check the range of the data once, over the whole dataset: `y.min(), y.max()`")
    return "an index is out of range" + _where(facts), "; ".join(parts), tuple(advice)


def nan_loss(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    step = re.search(r"step (\d+)", message)
    parts = []
    if step:
        parts.append(f"the loss was first non-finite at step {step.group(1)}")
    bad = [t.name for t in facts.user_tensors if t.finite is False]
    if bad:
        parts.append("non-finite in the cell: " + ", ".join(bad))
    anomaly = re.search(r"Function '(\w+)' returned nan values", message)
    if anomaly:
        parts.append(f"{anomaly.group(1)} produced NaN in backward")
    lr = extra.get("lr")
    if lr is not None:
        parts.append(f"learning rate {lr:g}")
    advice = [
        "lower the learning rate (10x) or add warm-up; clip gradients with `%%train --clip 1.0`",
        "`%%train --on-nan skip` drops the bad batch, `--on-nan rollback` also restores the last "
        "good weights",
        "check the inputs: `torch.isfinite(x).all()` for each batch; log/sqrt/division need an "
        "epsilon (`torch.log(p + 1e-8)`)",
    ]
    if str(extra.get("amp", "")) == "fp16":
        advice.insert(1, "fp16 overflows where bf16 does not: `%%train --amp bf16`")
    return "the loss became NaN or infinite" + _where(facts), "; ".join(parts), tuple(advice)


def dataloader_worker(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    parts = []
    shm = extra.get("shm_bytes")
    if shm is not None:
        parts.append(f"/dev/shm is {size(shm)}")
    if facts.num_workers is not None:
        parts.append(f"num_workers={facts.num_workers}")
    if facts.batch_size:
        parts.append(f"batch size {facts.batch_size}")
    signal = re.search(r"killed by signal: ([\w ]+)", f"{message}\n{extra.get('chain', '')}")
    if signal:
        parts.insert(0, f"a worker was killed by signal {signal.group(1).strip()}")
    advice = []
    from ..doctor.checks import SHM_MIN_BYTES  # what `trainmate doctor` warns below

    if re.search(r"bus error|shared memory|shm|</torch_", message, re.IGNORECASE) or (
        shm is not None and shm < SHM_MIN_BYTES
    ):
        advice.append(
            "shared memory is too small for the workers' batches: start the container with "
            "--shm-size=8g (or --ipc=host); `trainmate doctor` shows /dev/shm"
        )
    if signal and "Killed" in signal.group(1):
        advice.append(
            "`Killed` is the out-of-memory killer: fewer workers (each copies the dataset "
            "object), or keep large data in a file read lazily in __getitem__"
        )
    advice.append(
        "set num_workers=0 once: the real error inside the dataset (if any) then shows directly"
    )
    advice.append(_restart_advice(extra, "when a worker dies"))
    return "a DataLoader worker process died" + _where(facts), "; ".join(parts), tuple(advice)


def too_many_open_files(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    limits = extra.get("nofile")
    parts = []
    if limits is not None:
        parts.append(f"the open-file limit is {limits[0]} (hard {limits[1]})")
    if facts.num_workers is not None:
        parts.append(f"num_workers={facts.num_workers}")
    advice = [
        "close files in the Dataset: `with open(path) as f:` in __getitem__ instead of keeping "
        "handles in lists",
        "workers share tensors through file descriptors: "
        "`torch.multiprocessing.set_sharing_strategy('file_system')`",
        "raise the limit: `ulimit -n 65536` before starting Jupyter "
        "(or resource.setrlimit(resource.RLIMIT_NOFILE, ...) up to the hard limit)",
        "fewer DataLoader workers or a smaller prefetch_factor",
    ]
    return (
        "the process ran out of file descriptors" + _where(facts),
        "; ".join(parts),
        tuple(advice),
    )


def cudnn_cublas(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    status = re.search(r"(CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+)", message)
    parts = [status.group(1)] if status else []
    if facts.tensors():
        parts.append(_listing(facts.tensors()))
    versions = extra.get("versions")
    if versions:
        parts.append(versions)
    advice = [
        "these often report an earlier error late: " + RELAUNCH,
        "out of memory in disguise: try a smaller batch or `%%train --accumulate 2`",
        "a shape or dtype the kernel cannot take (check the tensors above), or a torch build "
        "that does not match the driver: `trainmate doctor`",
        "to isolate cuDNN: `torch.backends.cudnn.enabled = False` for one run",
    ]
    return "a cuDNN/cuBLAS call failed" + _where(facts), "; ".join(parts), tuple(advice)


def inplace_autograd(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    what = re.search(
        r"\[(torch\.[\w.]+) \[([\d, ]*)\]\], which is output (\d+) of (\w+), is at version (\d+); "
        r"expected version (\d+)",
        message,
    )
    cause = ""
    if what:
        cause = (
            f"a {what.group(1)} of shape [{what.group(2)}] (output {what.group(3)} of "
            f"{what.group(4)}) was changed in place after it was used: version {what.group(5)}, "
            f"autograd saved version {what.group(6)}"
        )
    advice = (
        "replace in-place updates of tensors the graph uses: `x = x + y` instead of `x += y`, "
        "`x = x.clamp(...)` instead of `x.clamp_(...)`, `nn.ReLU(inplace=False)`",
        "`.clone()` a tensor before changing it in place when its old value is needed",
        "`torch.autograd.set_detect_anomaly(True)` names the forward operation whose input "
        "changed (slow: for one step only)",
    )
    return "a tensor needed for backward was modified in place" + _where(facts), cause, advice


def backward_twice(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    carried = [t for t in facts.carried_graphs if t.name not in ("loss",)]
    cause = ""
    if carried:
        cause = "tensors of the cell that still hold a graph: " + "; ".join(
            f"{t.name} {tuple(t.shape)} ({t.grad_fn})" for t in carried[:4]
        )
    advice = (
        "a tensor carried from one step to the next keeps the old graph (an RNN's hidden state, "
        "a running total of losses): `.detach()` it at the end of each step, and accumulate "
        "`loss.item()`, not `loss`",
        "call backward() once per forward pass; two losses of one graph: `(loss1 + loss2).backward()`",
        "only when you mean to backpropagate twice: `loss.backward(retain_graph=True)`",
    )
    return "backward() ran through a graph that was already freed" + _where(facts), cause, advice


def _restart_advice(extra: Mapping[str, Any], when: str) -> str:
    """`--retries` advice: to add it, that a restart comes, or that the restarts were used up."""
    done, left = extra.get("retries") or (0, 0)
    if left > 0:
        return (
            "`--retries`: the run restarts from its last checkpoint"
            if extra.get("restartable")
            else "`--retries` restarts no run for this failure (a restart would fail the same way)"
        )
    if done:
        return (
            f"this run restarted {done} time(s) (--retries {done}) and failed again each time: "
            "the cause is not transient; fix it, then `--resume` from the last checkpoint"
        )
    when = f" {when}" if when else ""
    return f"a run with `%%train --checkpoint --retries 2` restarts from its last checkpoint{when}"


def unknown(message: str, facts: Facts, extra: Mapping[str, Any]) -> Built:
    advice: list[str] = []
    if extra.get("restartable"):
        done, left = extra.get("retries") or (0, 0)
        used_up = done and left <= 0  # then it was not transient after all
        prefix = (
            ""
            if used_up
            else "this looks transient (hardware, a collective timeout, an I/O error): "
        )
        advice.append(prefix + _restart_advice(extra, ""))
    cause = _listing(facts.tensors()) if facts.tensors() else ""
    return first_line(message) or "the cell raised", cause, tuple(advice)


BUILDERS: dict[ErrorKind, Builder] = {
    "out_of_memory": out_of_memory,
    "device_mismatch": device_mismatch,
    "dtype_mismatch": dtype_mismatch,
    "shape_mismatch": shape_mismatch,
    "index_out_of_range": index_out_of_range,
    "nan_loss": nan_loss,
    "dataloader_worker": dataloader_worker,
    "too_many_open_files": too_many_open_files,
    "cudnn_cublas": cudnn_cublas,
    "inplace_autograd": inplace_autograd,
    "backward_twice": backward_twice,
    "unknown": unknown,
}
