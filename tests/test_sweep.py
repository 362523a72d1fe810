"""`%%train --sweep N`: real Optuna studies over real (tiny) training runs, on the CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import jupyter_trainmate
from jupyter_trainmate import TrainmateError, suggest
from jupyter_trainmate.sweep.space import parse_space
from jupyter_trainmate.sweep.storage import PROCESS, open_storage

from .train_harness import COMMON, fresh_shell

FAST = "--display text --tensorboard off"

# The loop of every sweep here: two passes over 8 batches, the metric logged after each.
LOOP = """
for epoch in range(EPOCHS):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    jupyter_trainmate.log(val=loss.item())
"""

SUGGEST_CELL = (
    """
lr = jupyter_trainmate.suggest("lr", 1e-3, 0.5, log=True)
width = jupyter_trainmate.suggest("width", [4, 16])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))
opt = torch.optim.SGD(model.parameters(), lr=lr)
"""
    + LOOP
)


def shell(extra: str = "") -> InteractiveShell:
    ip = fresh_shell()
    ip.run_cell(COMMON + "\nimport jupyter_trainmate\nEPOCHS = 2\nrun_no = 0\n" + extra)
    return ip


def sweep(ip: InteractiveShell, line: str, cell: str) -> None:
    ip.run_cell(f"%%train {FAST} {line}\n{cell}").raise_error()


def records() -> list[dict[str, Any]]:
    lines = (Path("runs") / "runs.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def last() -> jupyter_trainmate.SweepSummary:
    summary = jupyter_trainmate.last_sweep()
    assert summary is not None
    return summary


# -- suggest() -----------------------------------------------------------------------------------


def test_suggest_outside_a_sweep_gives_the_default_the_middle_or_the_first_choice() -> None:
    assert suggest("lr", 1e-4, 1e-2, log=True) == pytest.approx(1e-3)
    assert suggest("lr", 0.0, 0.1) == pytest.approx(0.05)
    layers = suggest("layers", 1, 5)
    assert layers == 3
    assert isinstance(layers, int)
    assert suggest("x", 0.0, 1.0, step=0.3) == pytest.approx(0.6)  # the middle, on the grid
    assert suggest("width", [128, 256]) == 128
    assert suggest("lr", 1e-4, 1e-2, log=True, default=3e-4) == 3e-4
    assert jupyter_trainmate.last_sweep() is None


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("lr", 1e-2, 1e-4), {}, "need finite LOW < HIGH"),
        (("lr", 0.0, 1.0), {"log": True}, "log=True needs LOW > 0"),
        (("lr", 0.1), {}, "give LOW and HIGH, or a list of choices"),
        (("w", []), {}, "give at least one choice"),
        (("w", 1, 4), {"step": -1}, "step=-1 must be a number above 0"),
        (("w", "a", "b"), {}, "LOW and HIGH must be numbers"),
    ],
)
def test_bad_suggest_arguments_are_one_line_errors(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(TrainmateError, match=message) as info:
        suggest(*args, **kwargs)
    assert "\n" not in str(info.value)


def test_bad_input_in_a_sweep_is_a_usage_error_without_traceback() -> None:
    ip = shell()
    cell = 'lr = jupyter_trainmate.suggest("lr", 1.0, 0.1)\n' + LOOP
    with pytest.raises(UsageError, match=r"suggest\('lr', 1.0, 0.1\): need finite LOW < HIGH"):
        sweep(ip, "--sweep 3 --monitor val", cell)
    assert len(last().trials) == 1  # the search ended at the first trial
    for line, message in [
        ('--sweep 2 --monitor val --space "lr=abc"', "write NAME=LOW..HIGH"),
        ('--sweep 2 --monitor val --space "lr=1..x"', "'x' is not a number"),
        (
            '--sweep 2 --monitor val --space "lr=1..0.1"',
            '--space "lr=1..0.1": need finite LOW < HIGH',
        ),
        ('--sweep 2 --monitor val --space "betas2=0..1"', "no optimizer setting of that name"),
        ("--sweep 2", "name the metric to optimise with --monitor"),
        (
            "--study x --timeout 5 --monitor val --patience 2",
            "--study, --timeout: only with --sweep N",
        ),
        ("--prune none --sampler random", "--sampler, --prune: only with --sweep N"),
        ("--backend gloo", "--backend gloo: only with --procs N"),
        ("--sweep 2 --monitor val", "nothing to search"),
        (
            '--sweep 2 --monitor val --resume --study none --space "lr=0.1..0.2"',
            "--resume: no study 'none' in runs",
        ),
    ]:
        with pytest.raises(UsageError, match=message) as info:
            sweep(ip, line, LOOP)
        assert "\n" not in str(info.value)


def test_space_syntax() -> None:
    lr, momentum, steps = parse_space("lr=1e-5..1e-2:log momentum=[0.8,0.9] steps=1..9:step=2")
    assert (lr.kind, lr.low, lr.high, lr.log) == ("float", 1e-5, 1e-2, True)
    assert momentum.choices == (0.8, 0.9)
    assert steps.grid() == (1, 3, 5, 7, 9)


# -- the search ----------------------------------------------------------------------------------


def test_a_seeded_tpe_sweep_is_reproducible_and_recorded() -> None:
    found = []
    for _ in range(2):
        ip = shell()
        sweep(ip, "--sweep 3 --monitor val --seed 7 --prune none", SUGGEST_CELL)
        summary = last()
        found.append([(t.params, t.value, t.state) for t in summary.trials])
        assert "__trainmate__" not in ip.user_ns
    assert found[0] == found[1]
    assert len(found[0]) == 3
    assert all(state == "complete" for _, _, state in found[0])
    assert len({params["lr"] for params, _, _ in found[0]}) == 3  # the trials differ
    summary = last()
    assert summary.study.endswith("-2")  # the second run of the cell: a new study
    assert summary.best_value == min(v for _, v, _ in found[0] if v is not None)
    assert summary.best_params == summary.best_trial.params  # type: ignore[union-attr]
    assert all(t.duration is not None and t.duration > 0 for t in summary.trials)
    # each trial's run record names its study, number and parameters
    sweeps = [r["sweep"] for r in records()]
    assert sweeps[3:] == [
        {"study": summary.study, "trial": t.number, "params": t.params} for t in summary.trials
    ]
    assert [r["hyperparameters"]["optimizers"]["opt"]["lr"] for r in records()[3:]] == [
        pytest.approx(t.params["lr"]) for t in summary.trials
    ]


def _scripted(good: str) -> str:
    """A trial cell whose metric improves each epoch while `good` holds, else stays at 5.0."""
    return (
        """
run_no += 1
x = jupyter_trainmate.suggest("x", 0.0, 1.0)
for epoch in range(EPOCHS):
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
"""
        + f"    jupyter_trainmate.log(val=1.0 - 0.1 * epoch if {good} else 5.0)\n"
    )


def test_median_pruning_ends_bad_trials_at_their_second_report() -> None:
    # Trials 0-2 improve; trials 3-5 report a flat, bad metric: after 3 complete trials (more than
    # the pruner's start-up of 2) the median pruner ends each bad trial at its second report.
    ip = shell("EPOCHS = 4\n")
    cell = _scripted("run_no <= 3 or run_no == 6")
    sweep(ip, "--sweep 6 --monitor val --sampler random --seed 0", cell)
    summary = last()
    states = [t.state for t in summary.trials]
    assert states == ["complete"] * 3 + ["pruned"] * 2 + ["complete"]
    assert [t.value for t in summary.trials][3:5] == [5.0, 5.0]
    assert summary.trials[3].reason == "pruned at report 2: val=5"
    epochs = [r["summary"]["epochs"] for r in records()]
    assert epochs == [4, 4, 4, 2, 2, 4]
    assert records()[3]["outcome"] == "stopped early"
    assert summary.best_value == pytest.approx(0.7)


def test_median_pruning_starts_after_two_complete_trials() -> None:
    # The default's start-up is 2 complete trials (BENCHMARKS.md, sweep_pruning.py): a bad third
    # trial is already pruned, at its second report (never at its first).
    ip = shell("EPOCHS = 3\n")
    cell = _scripted("run_no <= 2")
    sweep(ip, "--sweep 3 --monitor val --sampler random --seed 0", cell)
    summary = last()
    assert [t.state for t in summary.trials] == ["complete", "complete", "pruned"]
    assert summary.trials[2].reason == "pruned at report 2: val=5"
    assert [r["summary"]["epochs"] for r in records()] == [3, 3, 2]


def test_space_searches_the_notebooks_optimizer_and_each_trial_restarts_bit_identically() -> None:
    keep = (
        "\nfinal.append(({k: v.clone() for k, v in model.state_dict().items()}, "
        "dict(lr=opt.param_groups[0]['lr'], momentum=opt.param_groups[0]['momentum'])))\n"
    )
    ip = shell("final = []\n")
    sweep(
        ip,
        '--sweep 3 --monitor val --seed 3 --prune none --space "lr=0.01..0.5:log momentum=[0.0,0.5]"',
        LOOP + keep,
    )
    summary = last()
    assert [t.state for t in summary.trials] == ["complete"] * 3
    final = ip.user_ns["final"]
    for trial, (weights, settings) in zip(summary.trials, final, strict=True):
        assert settings == pytest.approx(trial.params)
        # a fresh notebook: the same setup, the settings set by hand, the plain loop
        fresh = shell()
        for name, value in trial.params.items():
            fresh.user_ns["opt"].param_groups[0][name] = value
        fresh.run_cell(LOOP).raise_error()
        plain = fresh.user_ns["model"].state_dict()
        assert all(torch.equal(plain[k], weights[k]) for k in plain), trial.number


def test_a_failing_trial_does_not_stop_the_search_and_max_failures_does() -> None:
    ip = shell()
    cell = (
        "run_no += 1\nif run_no == 2:\n    raise ValueError('bad batch')\n"
        + SUGGEST_CELL.replace(
            "loss.backward()", "(loss * (math.nan if run_no == 3 else 1)).backward()"
        )
    )
    sweep(ip, "--sweep 4 --monitor val --seed 0 --on-nan stop --prune none", "import math\n" + cell)
    summary = last()
    assert [t.state for t in summary.trials] == ["complete", "failed", "failed", "complete"]
    assert summary.trials[1].reason == "ValueError: bad batch"
    assert summary.trials[2].reason == "NanDetected: --on-nan stop: non-finite loss at step 1"
    assert summary.stopped is None
    always = "raise RuntimeError('no data')\n" + SUGGEST_CELL
    sweep(ip, "--sweep 10 --monitor val --max-failures 2", always)
    summary = last()
    assert [t.state for t in summary.trials] == ["failed", "failed"]
    assert summary.stopped == "2 trials failed in a row (--max-failures 2)"
    assert summary.best_trial is None


def test_ctrl_c_marks_the_trial_and_resume_keeps_the_completed_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ip = shell()
    cell = "run_no += 1\nif run_no == 3:\n    raise KeyboardInterrupt\n" + SUGGEST_CELL
    result = ip.run_cell(
        f"%%train {FAST} --sweep 4 --monitor val --study s --seed 1 --prune none\n{cell}"
    )
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    summary = last()
    assert [t.state for t in summary.trials] == ["complete", "complete", "failed"]
    assert summary.trials[2].reason == "interrupted (Ctrl-C)"
    assert "trainmate sweep s: 3 trial(s) (2 complete, 1 failed)" in capsys.readouterr().out
    done = [(t.params, t.value) for t in summary.trials[:2]]
    sweep(ip, "--sweep 4 --monitor val --study s --seed 1 --prune none --resume", cell)
    summary = last()
    assert [t.state for t in summary.trials] == ["complete"] * 2 + ["failed"] + ["complete"] * 2
    assert [(t.params, t.value) for t in summary.trials[:2]] == done


def test_a_running_trial_of_a_dead_process_fails_on_resume() -> None:
    storage = open_storage(Path("runs") / "optuna.journal")
    study = optuna.create_study(study_name="s", storage=storage)
    dead = psutil.Popen(["python3", "-c", "pass"])
    started = dead.create_time()
    dead.wait()
    orphan = study.ask()
    orphan.set_user_attr(PROCESS, {"pid": dead.pid, "started": started})
    me = psutil.Process()
    alive = study.ask()  # still running in a live process: kept
    alive.set_user_attr(PROCESS, {"pid": me.pid, "started": me.create_time()})
    ip = shell()
    sweep(ip, "--sweep 1 --monitor val --study s --resume", SUGGEST_CELL)
    states = [t.state for t in last().trials]
    assert states == ["failed", "running", "complete"]
    assert last().trials[0].reason == "its process ended while it ran"


def test_best_trial_has_its_checkpoint(tmp_path: Path) -> None:
    ip = shell()
    sweep(ip, f"--sweep 2 --monitor val --seed 0 --checkpoint {tmp_path / 'ck'}", SUGGEST_CELL)
    best = last().best_trial
    assert best is not None
    assert best.checkpoint is not None
    assert Path(best.checkpoint).is_file()
    assert f"-trial-{best.number:03d}" in best.checkpoint
    assert not math.isnan(best.value or math.nan)


def test_trainmate_sweeps_lists_the_studies(capsys: pytest.CaptureFixture[str]) -> None:
    ip = shell()
    sweep(ip, "--sweep 2 --monitor val --study first --seed 0", SUGGEST_CELL)
    capsys.readouterr()
    ip.run_line_magic("trainmate", "sweeps")
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("first ")]
    assert row.split()[:4] == ["first", "2", "2", "0"]


# -- the bundled notebook, in a real kernel --------------------------------------------------------


@pytest.mark.slow
def test_sweep_notebook_keeps_the_study_in_widget_state_and_a_static_summary(
    tmp_path: Path,
) -> None:
    from .test_notebooks import execute

    nb = execute("sweep.ipynb", tmp_path)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = [m["state"] for m in state.values()]
    studies = [
        m["value"]
        for m in models
        if m.get("_model_name") == "HTMLModel" and "trainmate-trials" in m.get("value", "")
    ]
    assert len(studies) == 2  # one study widget per sweep cell, in its final state
    for study in studies:
        assert "Best parameters" in study
        assert 'data-series="best so far"' in study
    # the trial in progress had its training widget inside the study's Output widget
    outputs = [m for m in models if m.get("_model_name") == "OutputModel"]
    assert len(outputs) == 2
    assert all(o["outputs"] for o in outputs)
    sweeps = [c for c in nb.cells if c.cell_type == "code" and "--sweep" in c.source]
    for cell, trials in zip(sweeps, (6, 5), strict=True):
        displays = [o for o in cell.outputs if o.output_type == "display_data"]
        final = displays[-1]["data"]  # readable without widget state: text and HTML
        assert final["text/plain"].startswith("trainmate sweep ")
        assert f": {trials} trial(s) (" in final["text/plain"]
        assert final["text/html"].count('<tr class="trainmate-trial-') == trials
        assert "<svg" in final["text/html"]
        assert "Parameter importances" in final["text/html"]
    text = "\n".join(str(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))
    assert "best {'lr': " in text
    assert (tmp_path / "runs" / "optuna.journal").is_file()
    assert len([line for line in text.splitlines() if line.startswith("sweep-")]) == 2


def test_grid_sampler_runs_each_combination_once() -> None:
    ip = shell()
    cell = (
        'lr = jupyter_trainmate.suggest("lr", [0.01, 0.1])\n'
        'width = jupyter_trainmate.suggest("width", [4, 16])\n'
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=lr)\n" + LOOP
    )
    sweep(ip, "--sweep 10 --monitor val --sampler grid --seed 0 --prune none", cell)
    combos = sorted((t.params["lr"], t.params["width"]) for t in last().trials)
    assert combos == [(0.01, 4), (0.01, 16), (0.1, 4), (0.1, 16)]  # 4 of the 10: the grid's size
    with pytest.raises(UsageError, match="'lr' is a continuous range; give it step= or choices"):
        sweep(ip, "--sweep 2 --monitor val --sampler grid", SUGGEST_CELL)


def test_timeout_starts_no_trial_after_its_seconds() -> None:
    ip = shell()
    sweep(ip, "--sweep 5 --monitor val --timeout 0.001", SUGGEST_CELL)
    summary = last()
    assert len(summary.trials) == 1
    assert summary.stopped == "--timeout 0.001 s reached"


def test_retries_restart_a_trial_with_its_hooks(tmp_path: Path) -> None:
    """`--retries` inside a trial: the restarted attempt is the same trial (its run record says
    so, its log() still reports to it), and the trial completes. (The transient failure is
    remembered in a list the loop appends to: a flag the batch loop rebinds is a variable it
    carries from batch to batch, and the checkpoint puts it back as the failing batch began.)"""
    ip = shell("import errno\nfailures = []\n")
    cell = """
lr = jupyter_trainmate.suggest("lr", 1e-3, 0.5, log=True)
for epoch in range(EPOCHS):
    for i, (xb, yb) in enumerate(loader):
        if epoch == 1 and i == 3 and not failures:
            failures.append("EIO")
            raise OSError(errno.EIO, "Input/output error", "/data/x.pt")
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    jupyter_trainmate.log(val=0.5)
"""
    sweep(ip, f"--sweep 1 --monitor val --checkpoint {tmp_path} --retries 1", cell)
    assert [r["outcome"] for r in records()] == ["failed", "finished"]
    assert [r["sweep"]["trial"] for r in records()] == [0, 0]
    (trial,) = last().trials
    assert trial.state == "complete"
    assert trial.value == 0.5


# -- --monitor loss: the unchanged loop's own training loss -------------------------------------

PLAIN_LOOP = """
for epoch in range(EPOCHS):
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
    means.append(total / len(loader))
"""


def test_monitor_loss_sweeps_a_loop_that_logs_nothing() -> None:
    """`--space` and `--monitor loss`: no line of the loop changes; each trial's value is its
    best epoch's mean training loss, as the loop itself computes it."""
    ip = shell("means = []\n")
    sweep(ip, '--sweep 2 --monitor loss --space "lr=0.01..0.3:log" --seed 0 --study plain',
          PLAIN_LOOP)  # fmt: skip
    summary = last()
    means = ip.user_ns["means"]
    assert [t.state for t in summary.trials] == ["complete", "complete"]
    for n, trial in enumerate(summary.trials):
        assert trial.value == pytest.approx(min(means[2 * n : 2 * n + 2]), rel=1e-6)
    ip.run_cell("means.clear()").raise_error()
    ip.run_cell(f"%%train {FAST} --patience 5 --monitor loss\n{PLAIN_LOOP}").raise_error()
    run = jupyter_trainmate.last_run()
    assert run is not None
    assert run.metrics["loss"] == pytest.approx(ip.user_ns["means"][-1], rel=1e-6)


# Real notebooks build their optimizer in the training cell, keep `lr` in a variable, or train
# in a `range` loop with no loader (benchmarks/sweep_corpus.py: 4 of 13 searched before these).
IN_CELL = """
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
sgd = torch.optim.SGD(net.parameters(), lr=0.5)
for step in range(20):
    sgd.zero_grad()
    loss = loss_fn(net(x), y)
    loss.backward()
    sgd.step()
"""


def test_space_reaches_an_optimizer_the_cell_builds_in_a_range_loop() -> None:
    """The optimizer is built in the cell (lr=0.5 written there): the trial's lr goes in at its
    first step, exactly as if the cell had been written with it; the loop has no loader, so the
    run's mean loss is the value."""
    ip = shell()
    sweep(ip, '--sweep 2 --monitor loss --space "lr=0.01..0.1" --seed 3 --study cell', IN_CELL)
    summary = last()
    assert [t.state for t in summary.trials] == ["complete", "complete"]
    lr = summary.trials[1].params["lr"]
    assert ip.user_ns["sgd"].param_groups[0]["lr"] == lr
    trained = {k: v.clone() for k, v in ip.user_ns["net"].state_dict().items()}
    plain = shell()
    plain.run_cell(IN_CELL.replace("lr=0.5", f"lr={lr!r}")).raise_error()
    expected = plain.user_ns["net"].state_dict()
    assert all(torch.equal(trained[k], expected[k]) for k in expected)


def test_space_sets_a_number_variable_and_refuses_a_setting_nothing_has() -> None:
    ip = shell("rate = 0.5\n")
    cell = IN_CELL.replace("lr=0.5", "lr=rate")
    sweep(ip, '--sweep 2 --monitor loss --space "rate=0.01..0.1" --seed 3 --study var', cell)
    summary = last()
    assert ip.user_ns["rate"] == summary.trials[1].params["rate"]
    assert ip.user_ns["sgd"].param_groups[0]["lr"] == summary.trials[1].params["rate"]
    # d2lzh's scratch loops: no optimizer, and the cell sets `lr` itself: nothing to search
    scratch = shell("del opt\n")
    cell = (
        "w = torch.zeros(8, requires_grad=True)\nlr = 0.1\nfor step in range(3):\n"
        "    loss = (x @ w).pow(2).mean()\n    loss.backward()\n    with torch.no_grad():\n"
        "        w -= lr * w.grad\n        w.grad.zero_()\n"
    )
    with pytest.raises(UsageError, match="--space lr: no optimizer the cell stepped") as info:
        sweep(scratch, '--sweep 2 --monitor loss --space "lr=0.01..0.1" --study none', cell)
    assert "\n" not in str(info.value)
