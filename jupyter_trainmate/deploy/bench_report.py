"""`BenchReport`: the rows of `jupyter_trainmate.bench()`, a verdict per batch size, and output."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass

from .report import table


@dataclass(frozen=True)
class BenchRow:
    """One configuration. Latencies are per call (batch), in milliseconds; `skipped` says why not."""

    backend: str  # eager | compile | onnxruntime
    precision: str  # fp32 | bf16 | fp16
    batch_size: int
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    samples_per_s: float | None = None
    peak_memory_mb: float | None = None
    compile_s: float | None = None  # torch.compile: the warm-up call(s) that compiled
    recompiles: int | None = None  # graphs compiled inside the timed region (should be 0)
    timed_calls: int = 0
    blocks: int = 0
    skipped: str = ""
    note: str = ""

    @property
    def measured(self) -> bool:
        return self.p50_ms is not None


@dataclass(frozen=True)
class BenchReport:
    """Inference latency and throughput per backend, precision and batch size.

    Measured like `torch.utils.benchmark` (warm-up, `Timer` blocks of calls, eval mode and
    `torch.inference_mode`), the rows interleaved in `rounds` rounds; p50/p95/p99 are over the
    timed blocks (`timed_calls / blocks` calls each), each round weighing the same.
    `clock` "wall" is latency as a caller waits it; "cpu" is the calling thread's CPU time on
    one thread (steadier on a busy machine; it leaves out waiting for a core). Shows as a table in a notebook; `to_markdown()`, `to_text()`, `to_json()`.
    """

    rows: tuple[BenchRow, ...]
    device: str
    threads: int
    memory: str  # what peak memory measures
    min_run_time: float
    versions: dict[str, str]
    clock: str = "wall"  # or "cpu": the calling thread's CPU time, one thread
    rounds: int = 1  # the rows were timed interleaved, in this many rounds
    busy: str = ""  # a warning: the wall clock on a machine busier than its cores

    def verdicts(self) -> list[str]:
        """One line per batch size: the fastest configuration at p50 and its lead over eager fp32."""
        lines = []
        for size in sorted({r.batch_size for r in self.rows}):
            rows = [r for r in self.rows if r.batch_size == size and r.measured]
            if not rows:
                lines.append(f"batch {size}: nothing measured")
                continue
            best = min(rows, key=lambda r: r.p50_ms or 0.0)
            line = (
                f"batch {size}: fastest is {best.backend} {best.precision}, "
                f"{best.p50_ms:.3g} ms p50, {best.samples_per_s:,.0f} samples/s"
            )
            base = next((r for r in rows if (r.backend, r.precision) == ("eager", "fp32")), None)
            if base is not None and base is not best and base.p50_ms and best.p50_ms:
                line += f" ({base.p50_ms / best.p50_ms:.2f}x eager fp32)"
            lines.append(line)
        return lines

    def to_json(self) -> str:
        data = asdict(self)
        data["verdicts"] = self.verdicts()
        return json.dumps(data, indent=2)

    def to_markdown(self) -> str:
        return "\n".join(self._lines(markdown=True))

    def to_text(self) -> str:
        return "\n".join(self._lines(markdown=False))

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        return self.to_text()

    def plot_svg(self) -> str:
        """Latency (p50, ms) against batch size, one line per backend and precision, as SVG."""
        from ..display.chart import line_chart

        series: dict[str, list[tuple[float, float]]] = {}
        for r in self.rows:
            if r.p50_ms is not None:
                series.setdefault(f"{r.backend} {r.precision}", []).append((r.batch_size, r.p50_ms))
        return line_chart(series, width=480, height=200, x_label="batch size (p50 ms)")

    def to_html(self) -> str:
        """The table, the latency-against-batch-size chart and the verdicts, as HTML."""
        lines = self._lines(markdown=False)
        header, rows = HEADER, [_cells(r) for r in self.rows]
        cell = "<td style='text-align:right'>{}</td>"
        body = "".join(
            "<tr>" + "".join(cell.format(html.escape(c)) for c in row) + "</tr>" for row in rows
        )
        head = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in header) + "</tr>"
        verdicts = "".join(f"<li>{html.escape(v)}</li>" for v in self.verdicts())
        warning = f"<p>Warning: {html.escape(self.busy)}</p>" if self.busy else ""
        return (
            f"<p><b>{html.escape(lines[0])}</b></p>{warning}<table>{head}{body}</table>"
            f"{self.plot_svg()}<ul>{verdicts}</ul>"
        )

    def _lines(self, markdown: bool) -> list[str]:
        header = HEADER
        body = [_cells(r) for r in self.rows]
        clock = (
            "CPU time of the calling thread (time the OS gave the core to others left out)"
            if self.clock == "cpu"
            else "wall clock"
        )
        title = (
            f"Inference benchmark on {self.device}, {self.threads} thread(s), "
            f"min run time {self.min_run_time:g} s per row in {self.rounds} interleaved "
            f"round(s), {clock}; peak memory: {self.memory}"
        )
        return [
            f"**{title}**" if markdown else title,
            *(["", f"Warning: {self.busy}"] if self.busy else []),
            "",
            *table(header, body, markdown),
            "",
            *(f"- {line}" for line in self.verdicts()),
        ]


HEADER = [
    "backend",
    "precision",
    "batch",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "samples/s",
    "peak MB",
    "compile s",
    "recompiles",
    "calls",
    "note",
]


def _number(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _cells(r: BenchRow) -> list[str]:
    if not r.measured:
        return [r.backend, r.precision, str(r.batch_size), *[""] * 8, f"skipped: {r.skipped}"]
    return [
        r.backend,
        r.precision,
        str(r.batch_size),
        _number(r.p50_ms),
        _number(r.p95_ms),
        _number(r.p99_ms),
        f"{r.samples_per_s:,.0f}" if r.samples_per_s is not None else "",
        _number(r.peak_memory_mb, 4),
        _number(r.compile_s),
        "" if r.recompiles is None else str(r.recompiles),
        f"{r.timed_calls} in {r.blocks} blocks",
        r.note,
    ]
