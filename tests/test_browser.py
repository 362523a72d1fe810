"""JupyterLab in headless Chromium (Playwright): the trainmate sidebar dashboard, end to end."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from jupyter_client import BlockingKernelClient

import jupyter_trainmate

from .lab import CHROMIUM, CHROMIUM_ARGS, Lab, running_lab

# `make screenshots` points this at docs/images/ (the README's pictures).
SCREENSHOTS = Path(
    os.environ.get("TRAINMATE_SCREENSHOTS")
    or Path(__file__).resolve().parent.parent / "build" / "screenshots"
)
PANEL_TAB = '.jp-SideBar.jp-mod-right li[data-id="jupyter-trainmate-panel"]'

SETUP = """
%load_ext jupyter_trainmate
import time, torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.randn(8), torch.tensor(i % 2)

loader = DataLoader(Slow(), batch_size=8)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
TRAIN = """%%train
for epoch in range(6):
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
"""


@contextmanager
def browser_page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
            assert not [e for e in errors if "trainmate" in e.lower()], errors
        finally:
            browser.close()


def open_panel(page: Any, lab: Lab) -> None:
    page.goto(lab.lab_url(), wait_until="domcontentloaded")
    tab = page.locator(PANEL_TAB)
    tab.wait_for(timeout=60_000)
    tab.click()
    version = page.locator(".jp-TrainmatePanel-version")
    version.and_(page.locator('[data-state="ok"]')).wait_for(timeout=30_000)
    assert version.inner_text() == f"jupyter_trainmate {jupyter_trainmate.__version__}"


def start_session_kernel(lab: Lab, notebook: str) -> BlockingKernelClient:
    """A kernel started by the lab's server for `notebook` (as opening it would), driven over ZMQ."""
    body = json.dumps(
        {"path": notebook, "name": notebook, "type": "notebook", "kernel": {"name": "python3"}}
    ).encode()
    request = urllib.request.Request(
        f"{lab.url}api/sessions",
        data=body,
        method="POST",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        kernel_id = json.loads(response.read())["kernel"]["id"]
    connection = lab.runtime / f"kernel-{kernel_id}.json"
    deadline = time.monotonic() + 60
    # Connect once the server saw the kernel answer (before, the heartbeat may not answer yet).
    while time.monotonic() < deadline:
        state = urllib.request.Request(
            f"{lab.url}api/kernels/{kernel_id}", headers={"Authorization": f"token {lab.token}"}
        )
        with urllib.request.urlopen(state, timeout=30) as response:
            if json.loads(response.read())["execution_state"] not in {"starting", "unknown"}:
                break
        time.sleep(0.2)
    client = BlockingKernelClient(connection_file=str(connection))
    client.load_connection_file()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return client


@pytest.mark.browser
@pytest.mark.slow
def test_sidebar_shows_host_metrics_and_a_train_run_while_it_runs(tmp_path: Path) -> None:
    with running_lab(tmp_path) as lab, browser_page() as page:
        bundled = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
        for notebook in bundled:  # the folder `make lab` opens
            (lab.root / notebook.name).write_bytes(notebook.read_bytes())
        nbformat.write(nbformat.v4.new_notebook(), lab.root / "train_demo.ipynb")
        open_panel(page, lab)
        for notebook in bundled:
            page.locator(".jp-DirListing-itemText", has_text=notebook.name).wait_for(timeout=30_000)
        # This machine has no GPU: the panel says why, and shows the host.
        status = page.locator(".jp-TrainmatePanel-status")
        page.wait_for_function(
            "() => document.querySelector('.jp-TrainmatePanel-status').textContent.startsWith('No GPU data: NVML')"
        )
        host = page.locator(".jp-TrainmatePanel-host")
        host.wait_for(timeout=10_000)
        assert "CPUs" in host.inner_text()
        assert "GiB" in host.inner_text()
        assert "No %%train run in progress" in page.locator(".jp-TrainmatePanel-runs").inner_text()
        assert status.get_attribute("data-state") == "ok"

        client = start_session_kernel(lab, "train_demo.ipynb")
        try:
            reply = client.execute_interactive(SETUP, timeout=120)
            assert reply["content"]["status"] == "ok"
            msg_id = client.execute(TRAIN)
            run = page.locator(".jp-TrainmatePanel-run")
            run.wait_for(timeout=30_000)
            page.wait_for_function(
                """() => {
                    const el = document.querySelector('.jp-TrainmatePanel-runProgress');
                    return el !== null && /epoch [1-6]\\/6/.test(el.textContent);
                }""",
                timeout=20_000,
            )
            text = run.inner_text()
            assert "train_demo.ipynb: loader" in text
            assert "samples/s" in text
            assert "ETA" in text
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "sidebar-run.png"))
            run.click()  # opens the notebook the run belongs to
            page.locator(
                '.lm-TabBar-tab[data-type="document-title"] >> text=train_demo.ipynb'
            ).first.wait_for(timeout=20_000)
            # The run ends: it leaves the list.
            reply = client.get_shell_msg(timeout=120)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = client.get_shell_msg(timeout=120)
            assert reply["content"]["status"] == "ok", reply["content"]
            page.locator(".jp-TrainmatePanel-empty").wait_for(timeout=20_000)
            assert not list((lab.runtime / "trainmate-runs").glob("*.json"))
        finally:
            client.stop_channels()


@pytest.mark.browser
@pytest.mark.slow
def test_sidebar_draws_gpu_cards_from_the_fake_source(tmp_path: Path) -> None:
    fake = [
        {"name": "Fake H200 <b>bold?</b>", "utilization_pct": 87.0, "memory_used_bytes": 60 * 2**30,
         "memory_total_bytes": 141 * 2**30, "temperature_c": 55.0, "power_w": 412.0, "power_limit_w": 700.0},
        {"name": "Fake A10G", "utilization_pct": 12.0},
    ]  # fmt: skip
    with (
        running_lab(tmp_path, env={"TRAINMATE_FAKE_GPUS": json.dumps(fake)}) as lab,
        browser_page() as page,
    ):
        open_panel(page, lab)
        cards = page.locator(".jp-TrainmatePanel-gpu")
        cards.first.wait_for(timeout=20_000)
        assert cards.count() == 2
        first = cards.nth(0).inner_text()
        assert "GPU 0: Fake H200 <b>bold?</b>" in first  # server text is shown as text, not HTML
        assert page.locator(".jp-TrainmatePanel-gpu b").count() == 0
        assert "87%" in first
        assert "60.0 / 141.0 GiB" in first
        assert "55 °C" in first
        assert "412 W / 700 W" in first
        assert "(fake GPU source)" in page.locator(".jp-TrainmatePanel-status").inner_text()
        page.locator(".jp-TrainmatePanel-sparkline polyline").first.wait_for(state="attached")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "sidebar-gpus-fake.png"))

        # A failing server is a state in the panel, and the last good numbers stay.
        page.route(
            "**/trainmate/api/metrics*", lambda route: route.fulfill(status=500, body="boom")
        )
        page.wait_for_function(
            "() => document.querySelector('.jp-TrainmatePanel-status').dataset.state === 'error'",
            timeout=15_000,
        )
        assert "Metrics unavailable" in page.locator(".jp-TrainmatePanel-status").inner_text()
        assert "retrying in" in page.locator(".jp-TrainmatePanel-status").inner_text()
        assert cards.count() == 2
        page.unroute("**/trainmate/api/metrics*")

        # Hidden panel: no polling.
        polls: list[str] = []
        page.on(
            "request",
            lambda r: (
                polls.append(r.url)
                if re.search("trainmate/api/(metrics|gpu-processes)", r.url)
                else None
            ),
        )
        page.locator(PANEL_TAB).click()  # collapse the sidebar
        page.locator(".jp-TrainmatePanel").wait_for(state="hidden")
        page.wait_for_timeout(1000)
        polls.clear()
        page.wait_for_timeout(6000)  # three poll intervals
        assert polls == []
        page.locator(PANEL_TAB).click()  # shown again: polling resumes
        page.wait_for_timeout(3000)
        assert polls


@pytest.mark.browser
@pytest.mark.slow
def test_quickstart_widget_updates_while_the_train_cell_runs(tmp_path: Path) -> None:
    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
    with running_lab(tmp_path) as lab, browser_page() as page:
        (lab.root / "quickstart.ipynb").write_text(notebook.read_text())
        page.goto(lab.lab_url("lab/tree/quickstart.ipynb"), wait_until="domcontentloaded")
        page.locator(".jp-Notebook").wait_for(timeout=60_000)
        # The kernel is connected and idle (the status bar says so), then Run > Run All Cells;
        # retried once if the click landed before the notebook was ready to run.
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
        for _ in range(2):
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            try:
                page.locator(
                    ".jp-InputPrompt:has-text('[*]'), .jp-InputPrompt:has-text('[1]')"
                ).first.wait_for(timeout=10_000)
                break
            except Exception:
                continue
        widget = page.locator(".trainmate-widget")
        widget.wait_for(timeout=60_000)
        # While it runs: the progress text and the chart change between two looks (from the
        # third epoch, so the README's picture shows a loss curve).
        page.wait_for_function(
            "() => /epoch [3-9]\\/10/.test(document.querySelector('.trainmate-widget').textContent)",
            timeout=60_000,
        )
        first_text = widget.inner_text()
        first_chart = widget.locator("polyline[data-series='loss']").get_attribute("points")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "widget-running.png"))
        page.wait_for_timeout(700)
        assert widget.inner_text() != first_text
        assert widget.locator("polyline[data-series='loss']").get_attribute("points") != first_chart
        # At the end: the final summary, in the widget and as a static block.
        page.locator(".trainmate-run").wait_for(timeout=120_000)
        assert (
            "trainmate: finished after 10 epoch(s)" in page.locator(".trainmate-run").inner_text()
        )
        assert "100% | epoch 10/10" in widget.inner_text()
        page.screenshot(path=str(SCREENSHOTS / "widget-finished.png"))


SYSTEM_NOTIFICATIONS_SPY = """
window.trainmateSystemNotifications = [];
window.Notification = class {
  static permission = 'granted';
  static requestPermission() { return Promise.resolve('granted'); }
  constructor(title, options) {
    window.trainmateSystemNotifications.push({ title, body: options.body });
  }
};
"""


def _kernel_pid(client: BlockingKernelClient) -> int:
    """The kernel's process, found by the connection file on its command line."""
    name = Path(client.connection_file).name
    for process in psutil.process_iter(["cmdline"]):
        if any(name in part for part in process.info["cmdline"] or ()):
            return int(process.pid)
    raise AssertionError(f"no process runs {name}")


@pytest.mark.browser
@pytest.mark.slow
def test_gpu_memory_by_notebook_and_a_toast_when_a_background_run_ends(tmp_path: Path) -> None:
    """One lab for both: the GPU memory list (fake NVML processes of real kernels) and its
    shut-down action; then a run of a notebook whose tab is in the background ends, a toast
    says so, and its action brings the notebook back at the cell that ran."""
    processes = tmp_path / "gpu-processes.json"
    fake = [
        {"name": "Fake H200", "memory_used_bytes": 20 * 2**30, "memory_total_bytes": 141 * 2**30}
    ]
    env = {"TRAINMATE_FAKE_GPUS": json.dumps(fake), "TRAINMATE_FAKE_GPU_PROCESSES": str(processes)}
    # The lab's settings: system notifications on, and a threshold the run's --notify-after 0
    # overrides.
    settings = tmp_path / "settings" / "jupyter-trainmate" / "notifications.jupyterlab-settings"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"systemNotifications": True, "threshold": 3600}))
    with running_lab(tmp_path, env=env) as lab, browser_page() as page:
        # Headless Chromium shows no system notifications: record what the page asks for.
        page.add_init_script(SYSTEM_NOTIFICATIONS_SPY)
        train_nb = nbformat.v4.new_notebook()
        train_nb.cells = [
            nbformat.v4.new_code_cell(SETUP),
            nbformat.v4.new_code_cell(TRAIN.replace("%%train", "%%train --notify-after 0")),
        ]
        nbformat.write(train_nb, lab.root / "train_demo.ipynb")
        nbformat.write(nbformat.v4.new_notebook(), lab.root / "forgotten.ipynb")
        (lab.root / "notes.txt").write_text("while it trains\n")
        trainer = start_session_kernel(lab, "train_demo.ipynb")
        forgotten = start_session_kernel(lab, "forgotten.ipynb")
        try:
            forgotten_pid = _kernel_pid(forgotten)
            processes.write_text(json.dumps([
                {"gpu": 0, "pid": forgotten_pid, "used_bytes": 12 * 2**30},
                {"gpu": 0, "pid": _kernel_pid(trainer), "used_bytes": 3 * 2**30},
                {"gpu": 0, "pid": os.getpid(), "used_bytes": 1 * 2**30},  # no kernel: this test
            ]))  # fmt: skip
            # The training notebook is open in the lab, then another tab comes in front of it.
            page.goto(lab.lab_url("lab/tree/train_demo.ipynb"), wait_until="domcontentloaded")
            page.locator(".jp-Notebook .jp-Cell").nth(1).wait_for(timeout=60_000)
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
            page.locator(PANEL_TAB).click()
            holders = page.locator(".jp-TrainmatePanel-holder")
            holders.nth(1).wait_for(timeout=20_000)
            rows = holders.all_inner_texts()
            assert rows[0].startswith("forgotten.ipynb\n12.0 GiB · idle for")  # most memory first
            assert rows[1].startswith("train_demo.ipynb\n3.0 GiB · idle")
            other = page.locator(".jp-TrainmatePanel-other").inner_text()
            assert other.startswith(f"pid {os.getpid()} · GPU 0 · 1.0 GiB · ")
            assert psutil.Process().cmdline()[0] in other  # this process's command line
            page.locator(".jp-DirListing-item", has_text="notes.txt").dblclick()
            page.locator(".jp-FileEditor").wait_for(timeout=20_000)
            assert not page.locator(".jp-NotebookPanel").is_visible()  # in the background
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "sidebar-gpu-memory.png"))

            # The run of the background notebook, sent as JupyterLab sends a cell (its id).
            reply = trainer.execute_interactive(SETUP, timeout=120)
            assert reply["content"]["status"] == "ok"
            cell_id = train_nb.cells[1].id
            content = {"code": train_nb.cells[1].source, "silent": False, "store_history": True,
                       "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}  # fmt: skip
            request = trainer.session.msg("execute_request", content, metadata={"cellId": cell_id})
            trainer.shell_channel.send(request)

            # Meanwhile: shut down the forgotten kernel from the sidebar, after the confirmation.
            holders.first.locator("[data-action=shutdown]").click()
            dialog = page.locator(".jp-Dialog")
            dialog.wait_for(timeout=10_000)
            assert "Shut down the kernel of forgotten.ipynb?" in dialog.inner_text()
            assert "12.0 GiB of GPU memory freed" in dialog.inner_text()
            dialog.locator(".jp-mod-accept").click()
            deadline = time.monotonic() + 30
            while psutil.pid_exists(forgotten_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not psutil.pid_exists(forgotten_pid)
            page.wait_for_function(
                "() => document.querySelectorAll('.jp-TrainmatePanel-holder').length === 1",
                timeout=20_000,
            )
            assert holders.first.inner_text().startswith("train_demo.ipynb")

            # The run ends: a toast with the notebook, outcome, duration and final loss.
            toast = page.get_by_text("train_demo.ipynb: %%train finished after")
            toast.wait_for(timeout=120_000)
            assert re.search(r"finished after \d+s · loss \d\.\d{3}", toast.inner_text())
            assert page.evaluate("window.trainmateSystemNotifications") == [
                {"title": "%%train finished", "body": toast.inner_text().strip()}
            ]
            page.wait_for_timeout(1000)  # the toast has slid in
            page.screenshot(path=str(SCREENSHOTS / "toast-run-ended.png"))
            assert not page.locator(".jp-NotebookPanel").is_visible()
            page.get_by_role("button", name="Open notebook").click()
            active = page.locator(".jp-NotebookPanel:visible .jp-Cell.jp-mod-active")
            active.wait_for(timeout=20_000)
            assert "%%train --notify-after 0" in active.inner_text()  # at the cell that ran
        finally:
            trainer.stop_channels()
            forgotten.stop_channels()
