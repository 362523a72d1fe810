"""JupyterLab in headless Chromium (Playwright): the trainmate sidebar dashboard, end to end."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
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
    deadline = time.monotonic() + 30
    while not connection.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
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
            "request", lambda r: polls.append(r.url) if "trainmate/api/metrics" in r.url else None
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
