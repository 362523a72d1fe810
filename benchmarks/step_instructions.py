"""What `%%train` adds to a training loop, in instructions counted by callgrind: a figure the
machine's load cannot move.

On this project's shared machines a 500-step run of the tiny MLP varies by +-8% in wall and CPU
time between identical runs, so the 1-2 points `%%train` adds per step and per run cannot be told
apart in `train_overhead.py` from one round to the next. Valgrind's callgrind counts the
instructions each thread executes (`Ir`), which is the same on every run of the same code: this
script runs the `train_overhead.py` cell (64-128-10 MLP, batch 64, in-memory batches, one torch
thread) plainly and under `%%train` (default options, the text view), with callgrind's
instrumentation switched on only around each measured cell (client requests from a small C
helper built here with gcc, `valgrind/callgrind.h`), at two lengths (100 and 300 steps), so that:

- per step: the extra instructions of a `%%train` step over a plain step (the slope), and
- per run: the extra instructions of a run's set-up and end (the intercept),

both on the training thread (the one the loop runs on: callgrind's dump at a client request holds
the calling thread's counts; the display thread's ticks run beside it, and under valgrind, about
50 times slower, a run lasts long enough for many more of them than a real run has, so they are
left out).

Instructions are not time: a cache miss costs more than an add. The ratio of instructions says
what `%%train` asks the CPU to do on top of the loop; what the hardware makes of it is what
`train_overhead.py` measures on a quiet machine.

    python benchmarks/step_instructions.py [--keep DIR]   # runs itself under valgrind (minutes)

`--keep DIR` keeps callgrind's dump files (`callgrind_annotate DIR/cg.PID.N-01` shows where the
instructions of one measured cell went, by C function).

Needs `valgrind` and its headers (Debian `valgrind`) and `gcc`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HELPER = r"""
#include <valgrind/callgrind.h>
int running(void) { return RUNNING_ON_VALGRIND; }
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void stop(const char *name) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(name); }
"""
LENGTHS = (1, 3)  # epochs of 100 steps
# The stride the step timer picks for this loop at full speed on a quiet machine here (0.5 ms a
# step, about 32 timed points a second): a constant, not measured, so the count does not depend on
# how loaded the machine was when the script ran.
STRIDE = 62
REPEATS = 3  # each measured cell three times: the median, and how far the others are from it


def native_seconds() -> float:
    """The plain 100-step cell's wall time at full speed (median of 5, this process)."""
    import time

    import torch
    from IPython.core.interactiveshell import InteractiveShell

    sys.path.insert(0, str(Path(__file__).parent))
    from train_overhead import LOOP, SETUP

    torch.set_num_threads(1)
    ip = InteractiveShell.instance()
    ip.run_cell(SETUP).raise_error()
    cell = LOOP.replace("EPOCHS", "1")
    times = []
    for _ in range(6):
        started = time.perf_counter()
        ip.run_cell(cell, silent=True).raise_error()
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[2]


def slow_clocks(factor: float, stride: int) -> None:
    """Make what adapts to the clock behave per step as at full speed, and the same on every run:
    the step timer times one step in `stride` (the stride it picks at full speed: about 32 timed
    points a second; under valgrind, left alone, every step would be one, and the stride would
    follow the machine's load), and the display thread refreshes `factor` times less often."""
    import time

    from jupyter_trainmate.display import live
    from jupyter_trainmate.runtime import timing

    timing._clock = lambda: time.perf_counter() / 1e4  # every span short: the stride at its cap
    timing.MAX_STRIDE = stride  # type: ignore[misc]
    live.REFRESH_S *= factor  # type: ignore[misc]


def child(helper: Path, native: float) -> None:
    """Under valgrind: run the cells, each measured one between `start` and `stop`."""
    import ctypes
    import gc
    import time

    import torch
    from IPython.core.interactiveshell import InteractiveShell

    sys.path.insert(0, str(Path(__file__).parent))
    from train_overhead import LOOP, SETUP

    lib = ctypes.CDLL(str(helper))
    lib.stop.argtypes = [ctypes.c_char_p]
    if not lib.running():
        raise SystemExit("step_instructions: the child is not running under valgrind")
    torch.set_num_threads(1)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_trainmate")
    ip.run_cell(SETUP).raise_error()
    os.chdir(tempfile.mkdtemp(prefix="step-instructions-"))  # run records, event files
    calibration = LOOP.replace("EPOCHS", "1")
    ip.run_cell(calibration, silent=True).raise_error()
    lib.start()  # how much slower an instrumented run is than the same run at full speed
    started = time.perf_counter()
    ip.run_cell(calibration, silent=True).raise_error()
    factor = (time.perf_counter() - started) / native
    lib.stop(b"calibration")
    stride = STRIDE
    print(
        f"under callgrind: {factor:.0f} times slower; one step in {stride} timed, as at full speed"
    )
    slow_clocks(factor, stride)
    for epochs in LENGTHS:
        loop = LOOP.replace("EPOCHS", str(epochs))
        cells = {"plain": loop, "train": "%%train\n" + loop}
        for cell in cells.values():  # warm-up: imports, the rewrite cache, first-call paths
            ip.run_cell(cell, silent=True).raise_error()
        for repeat in range(REPEATS):
            for name, cell in cells.items():
                gc.collect()  # no full collection of the session's objects inside a measured run
                lib.start()
                ip.run_cell(cell, silent=True).raise_error()
                lib.stop(f"{name}-{epochs}-{repeat}".encode())


def counts(folder: Path) -> dict[str, dict[int, int]]:
    """{dump name: {thread number: instructions}} from callgrind's dump files."""
    found: dict[str, dict[int, int]] = {}
    for path in folder.glob("cg.*"):
        match = re.search(r"-(\d+)$", path.name)  # --separate-threads: cg.PID.N-TID
        thread = int(match.group(1)) if match else 1
        text = path.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: Client Request: (\S+)", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and total:
            found.setdefault(trigger.group(1), {})[thread] = int(total.group(1))
    return found


def under_callgrind(
    script: str, native: float, keep: Path | None = None
) -> tuple[str, dict[str, dict[int, int]]]:
    """Run `script --child HELPER NATIVE` under callgrind (instrumentation off at the start, one
    dump file per thread and client request); its output and `counts` of its dumps. Shared with
    `sweep_instructions.py`."""
    name = Path(script).stem
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        folder = Path(tmp)
        (folder / "helper.c").write_text(HELPER)
        helper = folder / "libhelper.so"
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", "-o", str(helper), str(folder / "helper.c")],
            check=True,
        )
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
            f"--callgrind-out-file={folder}/cg.%p", sys.executable, script, "--child",
            str(helper), str(native),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name}: the run failed:\n{done.stderr[-2000:]}")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for path in folder.glob("cg.*"):
                shutil.copy(path, keep / path.name)
        return done.stdout.strip(), counts(folder)


def main() -> None:
    if shutil.which("valgrind") is None or shutil.which("gcc") is None:
        raise SystemExit("step_instructions: needs valgrind and gcc")
    keep = Path(sys.argv[sys.argv.index("--keep") + 1]) if "--keep" in sys.argv else None
    output, found = under_callgrind(__file__, native_seconds(), keep)
    print(output)
    report(found)


def report(found: dict[str, dict[int, int]]) -> None:
    def main_thread(name: str) -> list[int]:
        return sorted(found[f"{name}-{r}"][1] for r in range(REPEATS))

    rows = {}
    for epochs in LENGTHS:
        plain, train = main_thread(f"plain-{epochs}"), main_thread(f"train-{epochs}")
        rows[epochs] = (plain[REPEATS // 2], train[REPEATS // 2])  # medians
        spread = max(
            abs(v / m - 1)
            for vs, m in ((plain, rows[epochs][0]), (train, rows[epochs][1]))
            for v in vs
        )
        print(
            f"{epochs * 100:4d} steps: plain {rows[epochs][0]:,} Ir, %%train {rows[epochs][1]:,} Ir "
            f"(median of {REPEATS}; every repeat within {spread * 100:.3f}% of its median)"
        )
    (s1, (p1, t1)), (s2, (p2, t2)) = [(e * 100, rows[e]) for e in LENGTHS]
    step_plain = (p2 - p1) / (s2 - s1)
    step_extra = ((t2 - p2) - (t1 - p1)) / (s2 - s1)
    run_extra = (t1 - p1) - step_extra * s1
    print(f"plain step: {step_plain:,.0f} Ir")
    print(
        f"%%train per step: +{step_extra:,.0f} Ir ({step_extra / step_plain * 100:.2f}% of a "
        f"plain step)"
    )
    print(
        f"%%train per run: +{run_extra:,.0f} Ir (= {run_extra / step_plain:.1f} plain steps; "
        f"{run_extra / (step_plain * 500) * 100:.2f}% of a 500-step run)"
    )
    plain_500 = p1 + step_plain * (500 - s1)  # the plain cell's run of 500 steps
    extra_500 = run_extra + step_extra * 500
    print(
        f"a 500-step run (train_overhead.py's): {(plain_500 + extra_500) / plain_500:.4f} x "
        "the plain run's instructions on the training thread"
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), float(sys.argv[3]))
    else:
        main()
