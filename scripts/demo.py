"""Execute every bundled notebook headless with nbclient; write the executed copies to build/demo/.

The bundled notebooks are never overwritten: each executed copy is written atomically under
build/demo/. Prints each notebook's last output line, so the demo shows what the run did.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "demo"


def last_text(nb: nbformat.NotebookNode) -> str:
    for cell in reversed(nb.cells):
        for output in reversed(cell.get("outputs", [])):
            if output.get("output_type") == "stream" and output.get("text", "").strip():
                return str(output["text"]).strip().splitlines()[-1]
    return "(no text output)"


def run(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    OUT.mkdir(parents=True, exist_ok=True)  # the kernel works here: run records, checkpoints
    started = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(OUT)}},
    )
    ok = True
    try:
        client.execute()
    except CellExecutionError as exc:
        ok = False
        print(f"{path.name}: FAILED: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
    with tempfile.NamedTemporaryFile("w", dir=OUT, suffix=".tmp", delete=False) as tmp:
        nbformat.write(nb, tmp)
    Path(tmp.name).replace(OUT / path.name)
    if ok:
        print(
            f"{path.name}: {len(nb.cells)} cells in {time.perf_counter() - started:.1f}s; {last_text(nb)}"
        )
    print(f"  executed copy: {(OUT / path.name).relative_to(ROOT)}")
    return ok


def refactor_quickstart() -> bool:
    """`trainmate refactor --execute --check-equivalence` on the quickstart, the package's own
    generated tests, then its CLI trains two epochs."""
    import subprocess

    target = OUT / "quickstart_package"
    command = [sys.executable, "-m", "jupyter_trainmate", "refactor"]
    made = subprocess.run(
        [
            *command,
            str(ROOT / "notebooks" / "quickstart.ipynb"),
            *("-o", str(target), "--force", "--execute", "--check-equivalence"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    print(made.stdout.strip() or made.stderr.strip())
    if made.returncode:
        return False
    report = (target / "REFACTOR_REPORT.md").read_text()
    for line in report.splitlines():
        if "parameters and returns annotated" in line or line.startswith(("PASSED", "FAILED")):
            print(f"  {line[:160]}")
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=target,
        capture_output=True,
        text=True,
        check=False,
    )
    summary = tested.stdout.strip().splitlines()[-1:] or ["(no output)"]
    print(f"  the package's generated tests: {summary[0]}")
    trained = subprocess.run(
        [sys.executable, "-m", "quickstart", "train", "--epochs", "2"],
        cwd=OUT,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in trained.stdout.splitlines() if line.startswith("trainmate:")]
    print(
        f"  python -m quickstart train --epochs 2: {lines[-1] if lines else trained.stderr[-300:]}"
    )
    return trained.returncode == 0 and tested.returncode == 0


def where_next() -> str:
    out = OUT.relative_to(ROOT)
    return "\n".join(
        [
            "",
            "Where to look next:",
            f"  {out}/*.ipynb             the executed notebooks (open them in JupyterLab: widgets saved)",
            f"  {out}/quickstart_package  the quickstart as a package (REFACTOR_REPORT.md, tests/, docs/)",
            f"  {out}/runs/runs.jsonl     the run records (`.venv/bin/trainmate runs` in {out})",
            "  make lab                          JupyterLab on notebooks/, with the sidebar",
        ]
    )


def main() -> int:
    results = [run(path) for path in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    results.append(refactor_quickstart())
    print(where_next())
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
