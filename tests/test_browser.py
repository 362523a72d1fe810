"""JupyterLab in headless Chromium (Playwright): the trainmate sidebar panel loads and talks to the server."""

from __future__ import annotations

from pathlib import Path

import pytest

import jupyter_trainmate

from .lab import CHROMIUM, CHROMIUM_ARGS, running_lab

SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"


@pytest.mark.browser
@pytest.mark.slow
def test_sidebar_panel_shows_server_version(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with running_lab(tmp_path) as lab, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(lab.lab_url(), wait_until="domcontentloaded")
            tab = page.locator('.jp-SideBar.jp-mod-right li[data-id="jupyter-trainmate-panel"]')
            tab.wait_for(timeout=60_000)
            tab.click()
            version = page.locator(".jp-TrainmatePanel-version")
            version.and_(page.locator('[data-state="ok"]')).wait_for(timeout=30_000)
            assert version.inner_text() == f"jupyter_trainmate {jupyter_trainmate.__version__}"
            assert page.locator(".jp-TrainmatePanel-status").inner_text() == "No GPU data yet"
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "sidebar-foundation.png"))
            assert not [e for e in errors if "trainmate" in e.lower()], errors
        finally:
            browser.close()
