"""`ExportReport`: what `jupyter_trainmate.export()` did, as a table, Markdown and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Attempt:
    """One exporter path tried: `dynamo`, `dynamo (batch 2 example)` or `torchscript`."""

    exporter: str
    ok: bool
    error: str = ""  # the exporter's first error line (the innermost cause)


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of the ONNX graph; `batch` marks the dynamic axis."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str


@dataclass(frozen=True)
class ParityRow:
    """One output on one input set: the largest differences against the reference."""

    inputs: str  # "example (batch 2)", "random (batch 8)"
    output: str
    max_abs: float
    max_rel: float
    passed: bool
    worst: str = ""  # where the largest excess over the tolerance is, and both values


@dataclass(frozen=True)
class Quantization:
    """The int8 model: its file, sizes and parity against the float ONNX model."""

    path: str
    size_before: int
    size_after: int
    parity: tuple[ParityRow, ...]
    rtol: float
    atol: float
    metric_float: float | None = None
    metric_int8: float | None = None

    @property
    def ratio(self) -> float:
        return self.size_after / self.size_before if self.size_before else float("nan")


@dataclass(frozen=True)
class ExportReport:
    """An ONNX export checked in onnxruntime (`jupyter_trainmate.export()` returns it).

    `passed` is True when every output matched PyTorch within the tolerance on every input set.
    It shows as a table in a notebook, `to_markdown()`/`to_text()`/`to_json()` give the rest.
    """

    path: str
    exporter: str
    attempts: tuple[Attempt, ...]
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parity: tuple[ParityRow, ...]
    rtol: float
    atol: float
    provider: str
    size: int
    quantization: Quantization | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.parity)

    def to_json(self) -> str:
        data = asdict(self)
        data["passed"] = self.passed
        return json.dumps(data, indent=2)

    def to_markdown(self) -> str:
        return "\n".join(_lines(self, markdown=True))

    def to_text(self) -> str:
        return "\n".join(_lines(self, markdown=False))

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        return self.to_text()


def report_path(model_path: Path) -> Path:
    """Where the JSON report goes: `model.onnx` -> `model.export.json`."""
    return model_path.with_suffix(".export.json")


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _shape(spec: TensorSpec) -> str:
    return "[" + ", ".join(str(d) for d in spec.shape) + "]"


def table(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return lines + ["| " + " | ".join(row) + " |" for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def paritytable(rows: tuple[ParityRow, ...], markdown: bool) -> list[str]:
    body = [
        [
            r.inputs,
            r.output,
            f"{r.max_abs:.2e}",
            f"{r.max_rel:.2e}",
            "ok" if r.passed else "FAILED",
            r.worst,
        ]
        for r in rows
    ]
    header = ["inputs", "output", "max abs diff", "max rel diff", "parity", "worst element"]
    return table(header, body, markdown)


def _lines(report: ExportReport, markdown: bool) -> list[str]:
    verdict = "parity ok" if report.passed else "parity FAILED"
    title = f"ONNX export: {report.path} ({verdict})"
    lines = [f"**{title}**" if markdown else title, ""]
    tried = "; ".join(
        f"{a.exporter}: {'ok' if a.ok else 'failed: ' + a.error}" for a in report.attempts
    )
    lines += [
        f"- exporter: {report.exporter} (tried {tried})",
        f"- opset {report.opset}, {_size(report.size)}, checked with onnxruntime {report.provider}",
        f"- tolerance: |onnx - torch| <= {report.atol:g} + {report.rtol:g} * |torch|",
    ]
    for kind, specs in (("inputs", report.inputs), ("outputs", report.outputs)):
        text = ", ".join(f"{s.name} {_shape(s)} {s.dtype}" for s in specs)
        lines.append(f"- {kind}: {text}")
    lines += ["", *paritytable(report.parity, markdown)]
    q = report.quantization
    if q is not None:
        lines += [
            "",
            f"int8 (dynamic, MatMul/Gemm): {q.path}: {_size(q.size_before)} -> "
            f"{_size(q.size_after)} ({q.ratio:.0%}); against the float ONNX model "
            f"(tolerance {q.atol:g} + {q.rtol:g} * |float|):",
            "",
            *paritytable(q.parity, markdown),
        ]
        if q.metric_float is not None and q.metric_int8 is not None:
            delta = q.metric_int8 - q.metric_float
            lines.append(
                f"\nmetric: float {q.metric_float:.6g}, int8 {q.metric_int8:.6g} (delta {delta:+.3g})"
            )
    if report.warnings:
        lines += ["", "warnings:", *(f"- {w}" for w in report.warnings)]
    return lines
