"""`trainmate report`: one self-contained HTML file (or Markdown) of real `%%train` runs and a sweep."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from jupyter_trainmate._state import reset
from jupyter_trainmate.cli import main
from jupyter_trainmate.runtime.records import read_records

from .lab import CHROMIUM, CHROMIUM_ARGS
from .train_harness import COMMON, fresh_shell

SCREENSHOTS = Path(
    os.environ.get("TRAINMATE_SCREENSHOTS")
    or Path(__file__).resolve().parent.parent / "build" / "screenshots"
)

LOOP = """
for epoch in range(4):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    with torch.no_grad():
        out = model(x)
        val_loss, acc = loss_fn(out, y), (out.argmax(1) == y).float().mean()
    jupyter_trainmate.log(val_loss=val_loss, val_acc=acc)
    if FAIL and epoch == 1:
        raise ValueError("the data ran out")
"""

SWEEP = [  # what the sweep helper writes for three trials of one study
    (0, {"lr": 0.1, "width": 16}, 0.41),
    (1, {"lr": 0.03, "width": 32}, 0.27),
    (2, {"lr": 0.01, "width": 16}, 0.35),
]


def _train(lr: float, line: str, fail: bool = False) -> None:
    ip = fresh_shell()
    ip.run_cell(COMMON + f"\nimport jupyter_trainmate\nFAIL = {fail}\n").raise_error()
    ip.run_cell(f"opt = torch.optim.SGD(model.parameters(), lr={lr}, momentum=0.9)").raise_error()
    ip.run_cell(f"%%train --display off {line}\n{LOOP}")
    reset()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Four real runs (one with TensorBoard event files, one failed) and three sweep trials."""
    project = tmp_path_factory.mktemp("project")
    old = os.environ.get("JPY_SESSION_NAME")
    os.environ["JPY_SESSION_NAME"] = str(project / "train.ipynb")
    try:
        _train(0.1, "--tensorboard on")
        _train(0.05, "--tensorboard off")
        _train(0.01, "--tensorboard off")
        _train(0.05, "--tensorboard off", fail=True)
    finally:
        if old is None:
            del os.environ["JPY_SESSION_NAME"]
        else:
            os.environ["JPY_SESSION_NAME"] = old
    runs = project / "runs"
    template = read_records(runs)[2]
    with (runs / "runs.jsonl").open("a") as f:
        for trial, params, value in SWEEP:
            record = {**template, "sweep": {"study": "lr-search", "trial": trial,
                                            "params": params, "value": value}}  # fmt: skip
            record["metrics"] = {"val_loss": value}
            f.write(json.dumps(record) + "\n")
    return runs


def _html(runs_dir: Path, out: Path, *extra: str) -> str:
    assert main(["report", str(runs_dir), "-o", str(out), *extra]) == 0
    return out.read_text()


def test_records_carry_curves_and_advice(runs_dir: Path) -> None:
    records = read_records(runs_dir)
    assert [r["outcome"] for r in records[:4]] == ["finished", "finished", "finished", "failed"]
    curves = records[1]["curves"]
    assert [x for x, _ in curves["val_acc"]] == [8, 16, 24, 32]  # one point per log(), at its step
    assert len(records[3]["curves"]["val_acc"]) == 2
    assert isinstance(records[1]["advice"], list)


def test_the_report_holds_the_runs_the_differing_params_the_curves_and_the_sweep(
    runs_dir: Path, tmp_path: Path
) -> None:
    html = _html(runs_dir, tmp_path / "report.html")
    runs_table = html.split('<table class="runs">')[1].split("</table>")[0]
    header = re.findall(r"<th>(.*?)</th>", runs_table.split("</thead>")[0])
    assert header[:8] == ["run", "time", "notebook", "outcome", "duration", "samples/s",
                          "steps/s", "data wait"]  # fmt: skip
    assert "optimizers.opt.lr" in header  # differs: 0.1, 0.05, 0.01
    assert "amp" not in header
    assert "batch_size" not in header
    assert "tensorboard" not in header  # how a run is shown or logged is not a hyperparameter
    assert {"val_acc final", "val_acc best", "val_loss final", "val_loss best"} <= set(header)
    rows = re.findall(r"<tr>(.*?)</tr>", runs_table.split("<tbody>")[1])
    assert len(rows) == 7
    assert '<td class="outcome-failed">failed</td>' in rows[3]
    assert "<td>0.01</td>" in rows[2]
    assert "<summary>Parameters shared by all runs" in html
    assert "<td>batch_size</td>" in html
    curves = html.split('<section id="curves">')[1].split("</section>")[0]
    assert "Curves from the run records." in curves
    charts = re.findall(r"<figcaption>(.*?)</figcaption>", curves)
    assert charts == ["loss", "val_acc", "val_loss"]
    val_acc = curves.split("<figcaption>val_acc</figcaption>")[1].split("</svg>")[0]
    assert set(re.findall(r'data-series="(#\d)"', val_acc)) == {"#2", "#3", "#4", "#5", "#6", "#7"}
    assert "last 6 with curves; choose others with --runs" in curves
    assert "samples per second" in html
    assert "share of step time waiting for data" in html
    sweeps = html.split('<section id="sweeps">')[1].split("</section>")[0]
    assert "<h3>Study lr-search</h3>" in sweeps
    best = re.findall(r'<tr class="best">(.*?)</tr>', sweeps)
    assert len(best) == 1
    assert "<td>1</td><td>#6</td>" in best[0]
    assert "<td>0.27</td>" in best[0]
    assert "Best: trial 1 (run #6), value 0.27 (lower is better)." in sweeps
    # Self-contained: nothing to fetch.
    assert "<script" not in html
    assert "src=" not in html
    assert "href=" not in html
    assert "@import" not in html
    assert "url(" not in html


def test_selected_runs_and_the_same_records_give_the_same_bytes(
    runs_dir: Path, tmp_path: Path
) -> None:
    first = _html(runs_dir, tmp_path / "a.html", "--runs", "1,4")
    again = _html(runs_dir, tmp_path / "b.html", "--runs", "1,4")
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()
    curves = first.split('<section id="curves">')[1].split("</section>")[0]
    assert set(re.findall(r'data-series="(#\d)"', curves)) == {"#1", "#4"}
    # Run #1's curves from its TensorBoard files (the loss at every reading), #4's from its record.
    assert (
        "Runs #1, #4 overlaid. Curves from TensorBoard event files and the run records." in curves
    )
    assert again == first


@pytest.mark.browser
def test_the_report_opens_in_chromium_with_its_charts(runs_dir: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    _html(runs_dir, out)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(out.as_uri())
            charts = page.locator("svg.trainmate-chart")
            assert charts.count() == 4  # loss, val_acc, val_loss, the sweep's values
            for i in range(charts.count()):
                box = charts.nth(i).bounding_box()
                assert box is not None
                assert box["width"] > 600
                assert box["height"] > 200
            assert page.locator("svg.trainmate-chart polyline").count() > 10
            assert page.locator("svg.trainmate-bars rect").count() == 14
            assert page.locator("tr.best").is_visible()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "report.png"), full_page=True)
            assert requests == [out.as_uri()]  # nothing else was fetched
        finally:
            browser.close()


def test_markdown_with_its_charts_beside_it(runs_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "docs" / "RESULTS.md"
    out.parent.mkdir()
    assert main(["report", str(runs_dir), "-o", str(out), "--markdown"]) == 0
    text = out.read_text()
    assert text.startswith("# Training report\n")
    assert "| run | time | notebook | outcome |" in text
    assert "![loss](RESULTS-loss.svg)" in text
    assert "![val_acc](RESULTS-val_acc.svg)" in text
    assert "| **1** | **#6** | **finished** |" in text  # the best trial
    svg = (out.parent / "RESULTS-val_acc.svg").read_text()
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"')
    assert "<polyline" in svg
    assert main(["report", str(runs_dir), "-o", str(out), "--markdown"]) == 2  # exists
    assert main(["report", str(runs_dir), "-o", str(out), "--markdown", "--force"]) == 0
    assert out.read_text() == text


def test_bad_input_is_one_line(
    runs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err == f"trainmate report: error: {tmp_path / 'nowhere'}: no such folder\n"

    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "empty/runs.jsonl: no run records" in capsys.readouterr().err

    torn = tmp_path / "torn"
    torn.mkdir()
    lines = (runs_dir / "runs.jsonl").read_text().splitlines()
    (torn / "runs.jsonl").write_text("\n".join([lines[0], '{"outcome": "fini', "[1, 2]", lines[1]]))
    out = tmp_path / "torn.html"
    assert main(["report", str(torn), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"trainmate report: warning: {torn / 'runs.jsonl'}:2: not valid JSON")
    assert (
        err[1] == f"trainmate report: warning: {torn / 'runs.jsonl'}:3: not a JSON object, skipped"
    )
    assert out.read_text().count("<tr><td>#") == 2

    out.write_text("mine")
    assert main(["report", str(torn), "-o", str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"trainmate report: error: {out}: already exists; --force replaces it\n"
    )
    assert out.read_text() == "mine"  # never lost
    assert main(["report", str(torn), "--runs", "9"]) == 2
    assert "--runs: no run #9" in capsys.readouterr().err


def test_the_magic_writes_the_report(runs_dir: Path, tmp_path: Path) -> None:
    ip = fresh_shell()
    ip.run_line_magic("trainmate", f"report {runs_dir} -o here.html")
    assert "<h1>Training report</h1>" in (tmp_path / "here.html").read_text()
    with pytest.raises(UsageError, match="no such folder"):
        ip.run_line_magic("trainmate", "report missing")


def test_without_tensorboard_the_records_curves_serve(
    runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jupyter_trainmate.report.curves as curves_module

    with_events = _html(runs_dir, tmp_path / "a.html", "--runs", "1")
    monkeypatch.setattr(curves_module, "tensorboard_readable", lambda: False)
    without = _html(runs_dir, tmp_path / "b.html", "--runs", "1")
    assert "Runs #1 overlaid. Curves from the run records." in without
    loss = without.split("<figcaption>loss</figcaption>")[1].split("</svg>")[0]
    points = re.findall(r'data-series="#1" points="([^"]*)"', loss)[0].split()
    events = with_events.split("<figcaption>loss</figcaption>")[1].split("</svg>")[0]
    assert 2 <= len(points) <= 64  # the record's downsampled curve
    assert re.findall(r'data-series="#1" points="([^"]*)"', events)  # the event files' readings


def test_the_report_file_gets_the_usual_mode_and_a_replaced_one_keeps_its_own(
    runs_dir: Path, tmp_path: Path
) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    out = tmp_path / "report.html"
    _html(runs_dir, out)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    out.chmod(0o600)
    _html(runs_dir, out, "--force")
    assert out.stat().st_mode & 0o777 == 0o600


def test_sweep_values_come_from_the_studys_journal(runs_dir: Path, tmp_path: Path) -> None:
    """What `%%train --sweep` writes: records name study, trial and params; the values and the
    direction live in runs/optuna.journal."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    runs = tmp_path / "runs"
    runs.mkdir()
    storage = JournalStorage(JournalFileBackend(str(runs / "optuna.journal")))
    study = optuna.create_study(study_name="acc-search", storage=storage, direction="maximize")
    template = read_records(runs_dir)[1]
    lines = []
    for told in (0.81, 0.9, None):
        trial = study.ask()
        width = trial.suggest_int("width", 8, 64)
        if told is None:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, told)
        sweep = {"study": "acc-search", "trial": trial.number, "params": {"width": width}}
        lines.append(json.dumps({**template, "sweep": sweep}))
    (runs / "runs.jsonl").write_text("\n".join(lines) + "\n")
    html = _html(runs, tmp_path / "report.html")
    sweeps = html.split('<section id="sweeps">')[1].split("</section>")[0]
    header = re.findall(r"<th>(.*?)</th>", sweeps)
    assert header == ["trial", "run", "outcome", "state", "width", "value"]
    rows = re.findall(r"<tr(?: class=\"best\")?>(.*?)</tr>", sweeps.split("<tbody>")[1])
    # (the outcome cell has a class: not matched)
    assert [re.findall(r"<td>(.*?)</td>", r)[2] for r in rows] == ["complete", "complete", "pruned"]
    assert [re.findall(r"<td>(.*?)</td>", r)[-1] for r in rows] == ["0.81", "0.9", "-"]
    assert "Best: trial 1 (run #2), value 0.9 (higher is better)." in sweeps
