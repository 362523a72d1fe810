"""`trainmate runs` / `%trainmate runs`: the run records as a table, or as a Markdown table kept
up to date between markers in a file (idempotent: the same records give the same file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import TrainmateError
from .runtime.files import write_text_atomically
from .runtime.records import read_records

START = "<!-- trainmate:runs:start -->"
END = "<!-- trainmate:runs:end -->"
COLUMNS = ("time", "notebook", "outcome", "epochs", "steps", "wall", "samples/s", "lr", "metrics")


def _row(record: dict[str, Any]) -> list[str]:
    summary = record.get("summary", {})
    lrs = [
        f"{o['lr']:.3g}" for o in record.get("hyperparameters", {}).get("optimizers", {}).values()
    ]
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(record.get("metrics", {}).items()))
    wall = float(summary.get("wall_s", 0.0))
    samples = float(summary.get("samples", 0))
    return [
        str(record.get("time", "")),
        Path(str(record.get("notebook") or "-")).name,
        str(record.get("outcome", "")),
        str(summary.get("epochs", "")),
        str(summary.get("steps", "")),
        f"{wall:.1f}s",
        f"{samples / wall:,.0f}" if wall > 0 else "-",
        ", ".join(lrs) or "-",
        metrics or "-",
    ]


def text_table(records: list[dict[str, Any]]) -> str:
    rows = [list(COLUMNS), *(_row(r) for r in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def markdown_table(records: list[dict[str, Any]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rows = [line(list(COLUMNS)), line(["---"] * len(COLUMNS)), *(line(_row(r)) for r in records)]
    return "\n".join(rows)


def update_markdown(path: Path, records: list[dict[str, Any]]) -> bool:
    """Put the table between the markers (added at the end if absent); True when the file changed."""
    old = path.read_text() if path.exists() else ""
    block = f"{START}\n{markdown_table(records)}\n{END}"
    if START in old and END in old:
        head, _, rest = old.partition(START)
        _, _, tail = rest.partition(END)
        new = head + block + tail
    elif START in old or END in old:
        raise TrainmateError(f"{path}: one runs marker without the other; fix the file by hand")
    else:
        new = (
            old
            + ("\n" if old and not old.endswith("\n") else "")
            + ("\n" if old else "")
            + block
            + "\n"
        )
    if new == old:
        return False
    write_text_atomically(path, new)
    return True


def runs_command(folder: Path, markdown: Path | None) -> int:
    records = read_records(folder)
    if markdown is not None:
        changed = update_markdown(markdown, records)
        print(
            f"{markdown}: {len(records)} run(s), {'updated' if changed else 'already up to date'}"
        )
        return 0
    if not records:
        print(f"no runs recorded in {folder}")
        return 0
    print(text_table(records))
    return 0
