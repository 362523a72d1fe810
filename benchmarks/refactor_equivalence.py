"""`trainmate refactor --execute --check-equivalence` on real notebooks: does the package's
`run(Config())` compute what the notebook computed, with the notebook's code unchanged?

    python benchmarks/refactor_equivalence.py CORPUS_DIR [--out DIR] [--only TEXT]
        [--extra-path DIR] [--timeout S] [--json FILE]

The notebooks are others' code and stay outside the repository:
`benchmarks/refactor_equivalence.toml` lists the ones measured in BENCHMARKS.md (repository, path,
commit; the files are named as in `refactor_corpus.toml`). They are notebooks that run top to
bottom on a CPU in about a minute: most make their own data; a notebook that reads a local data
file gets a small stand-in written by a recipe below (our own code, keyed by the notebook's file
name), in the folder beside the notebook, where the notebook expects it.

For each notebook the script copies it into a fresh working folder, writes its stand-in data
there, and runs the command as a user does, from that folder:
`trainmate refactor NB -o OUT/<name> --execute --check-equivalence --no-docs` (again with
`--skip-bad-cells` only when the command asks for it). It prints per notebook: the exit status,
the equivalence result (values compared, values differing, or the error line), the time of the
whole command, the failure's class, and the share of the package's parameters and returns
annotated (counted as `refactor_corpus.py` counts it: issue 12 asks for 90% with `--execute`);
then counts and medians. Third-party packages the
notebooks import (`--extra-path`, see `refactor_corpus_env.py`) reach the notebook's kernel and
the package's run through PYTHONPATH, as they would for a user whose environment has them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import refactor_corpus  # the annotated share, counted as the static corpus counts it

# --- stand-in data: small files where a notebook reads a local data set ---------------------


def _stock_daily(folder: Path) -> None:
    """`data-02-stock_daily.csv` of deeplearningzerotoall (np.loadtxt, 5 comma-separated columns
    Open, High, Low, Volume, Close under a `#` header): a random walk, 120 days."""
    rng = np.random.default_rng(0)
    close = 800 + np.cumsum(rng.normal(0, 5, 120))
    open_ = close + rng.normal(0, 2, 120)
    high = np.maximum(open_, close) + rng.uniform(0, 4, 120)
    low = np.minimum(open_, close) - rng.uniform(0, 4, 120)
    volume = rng.integers(1_000_000, 3_000_000, 120)
    rows = np.column_stack([open_, high, low, volume, close])
    lines = [",".join(f"{v:.6f}" for v in row) for row in rows]
    text = "# Open,High,Low,Volume,Close\n" + "\n".join(lines) + "\n"
    (folder / "data-02-stock_daily.csv").write_text(text)


def _mnist(root: str, train: int = 1000, test: int = 500) -> Callable[[Path], None]:
    """torchvision's MNIST files, uncompressed, in `root/MNIST/raw` (where `MNIST(root)` looks
    first: it downloads only when they are missing): idx files of random 28x28 images and
    labels, `train` and `test` of them."""

    def write(folder: Path) -> None:
        raw = folder / root / "MNIST" / "raw"
        raw.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for prefix, n in (("train", train), ("t10k", test)):
            images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
            labels = rng.integers(0, 10, n, dtype=np.uint8)
            header = np.array([2051, n, 28, 28], dtype=">i4").tobytes()
            (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
            header = np.array([2049, n], dtype=">i4").tobytes()
            (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(header + labels.tobytes())

    return write


STANDINS: dict[str, Callable[[Path], None]] = {
    "deeplearningzerotoall__PyTorch__RNN__5-timeseries.ipynb": _stock_daily,
    "MorvanZhou__PyTorch-Tutorial__tutorial-contents-notebooks__401_CNN.ipynb": _mnist("mnist"),
    "DeepLearningDTU__02456-deep-learning-with-PyTorch__3_Feedforward_PyTorch__3.4-EXE-FFN-MNIST"
    ".ipynb": _mnist("temp", train=1500),
}

# --- the run -------------------------------------------------------------------------------


@dataclass
class Result:
    notebook: str
    exit: int
    seconds: float
    compared: int = 0
    differing: int = 0
    error: str = ""
    failure: str = ""  # the class, "" when it passed
    skip_bad_cells: bool = False
    annotated: int = 0  # parameters and returns annotated, over the modules made from the notebook
    annotatable: int = 0

    @property
    def typed_share(self) -> float | None:
        return self.annotated / self.annotatable if self.annotatable else None


def classify(stderr: str, report: str) -> str:
    """The failure's class from the command's one-line error (and the report's table)."""
    line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if "--execute:" in line:
        if "needs a file" in line:
            return "notebook run: needs a file"
        if "needs the network" in line:
            return "notebook run: needs the network"
        if "ran longer" in line:
            return "notebook run: timeout"
        if "kernel died" in line:
            return "notebook run: kernel died"
        match = re.search(r"failed: (\w+)", line)
        return f"notebook run: {match.group(1) if match else 'failed'}"
    if "equivalence check failed" in line:
        match = re.search(r"run\(\) failed: (\w+)", line)
        if match:
            return f"package run(): {match.group(1)}"
        if "no number has the same name" in line:
            return "nothing compared"
        return "values differ"
    if "Traceback" in stderr:
        return "refactor: traceback"
    return "refactor: error" if line else "unknown"


def equivalence_table(report: str) -> tuple[int, int]:
    """(values compared, values differing) from REFACTOR_REPORT.md's equivalence table."""
    section = report.split("## Equivalence", 1)[-1].split("\n## ", 1)[0] if report else ""
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    return len(rows), sum(1 for r in rows if r.rstrip().lower().endswith("| no |"))


def run_one(notebook: Path, out_root: Path, timeout: float, extra: list[str]) -> Result:
    out = out_root / notebook.stem.replace(" ", "_")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *extra) if p)
    env["MPLBACKEND"] = "Agg"
    with tempfile.TemporaryDirectory(prefix="trainmate-equiv-") as tmp:
        work = Path(tmp)
        local = work / notebook.name
        shutil.copy(notebook, local)
        recipe = STANDINS.get(notebook.name)
        if recipe is not None:
            recipe(work)
        command = [sys.executable, "-m", "jupyter_trainmate", "refactor", str(local)]
        command += ["-o", str(out), "--execute", "--check-equivalence", "--no-docs"]
        started = time.perf_counter()
        skip = False
        try:
            proc = subprocess.run(
                command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout
            )
            if proc.returncode and "--skip-bad-cells" in proc.stderr:
                skip = True
                shutil.rmtree(out, ignore_errors=True)
                proc = subprocess.run(
                    [*command, "--skip-bad-cells"],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
        except subprocess.TimeoutExpired:
            seconds = time.perf_counter() - started
            return Result(notebook.name, -1, seconds, error="timeout", failure="benchmark timeout")
        seconds = time.perf_counter() - started
    report_file = out / "REFACTOR_REPORT.md"
    report = report_file.read_text() if report_file.exists() else ""
    compared, differing = equivalence_table(report)
    lines = proc.stderr.strip().splitlines()
    error = lines[-1][:300] if proc.returncode and lines else ""
    failure = classify(proc.stderr, report) if proc.returncode else ""
    result = Result(
        notebook.name, proc.returncode, seconds, compared, differing, error, failure, skip
    )
    package = _package(out)
    if package is not None:
        counted = refactor_corpus.Result(notebook.name)
        refactor_corpus.measure_code(counted, package)
        result.annotated, result.annotatable = counted.annotated, counted.annotatable
    return result


def _package(out: Path) -> Path | None:
    """The package folder the command wrote in `out` (the one holding `__main__.py`)."""
    found = sorted(p.parent for p in out.glob("*/__main__.py")) if out.is_dir() else []
    return found[0] if found else None


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="folder of notebooks (see the manifest)")
    parser.add_argument("--out", type=Path, default=None, help="where the packages go")
    parser.add_argument("--only", default="", help="only notebooks whose name contains this")
    parser.add_argument("--extra-path", action="append", default=[], help="third-party packages")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per notebook")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    notebooks = sorted(p for p in args.corpus.glob("*.ipynb") if args.only in p.name)
    out_root = args.out or Path(tempfile.mkdtemp(prefix="trainmate-equiv-out-"))
    extra = [str(Path(p).resolve()) for p in args.extra_path]
    results = []
    for notebook in notebooks:
        result = run_one(notebook, out_root.resolve(), args.timeout, extra)
        results.append(result)
        state = "PASS" if result.exit == 0 else f"FAIL {result.failure}"
        print(
            f"{result.notebook[:70]:70s} exit={result.exit} compared={result.compared} "
            f"differing={result.differing} typed={_share(result.typed_share)} "
            f"{result.seconds:6.1f}s {state}"
            + (" (--skip-bad-cells)" if result.skip_bad_cells else ""),
            flush=True,
        )
        if result.error:
            print(f"    {result.error}", flush=True)
    if not results:
        print("no notebooks", file=sys.stderr)
        return 1
    passed = sum(1 for r in results if r.exit == 0)
    print(f"\n{len(results)} notebooks: {passed} pass, {len(results) - passed} fail")
    for failure, count in Counter(r.failure for r in results if r.failure).most_common():
        print(f"  {count} x {failure}")
    print(f"median time {statistics.median(r.seconds for r in results):.1f} s")
    print(f"median values compared {statistics.median(r.compared for r in results):.0f}")
    shares = [r.typed_share for r in results if r.exit == 0 and r.typed_share is not None]
    if shares:
        print(f"median annotated share (packages written) {statistics.median(shares):.0%}")
    if args.json:
        rows = [{**asdict(r), "typed_share": r.typed_share} for r in results]
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
