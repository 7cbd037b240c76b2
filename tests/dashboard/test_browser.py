"""The dashboard in a real browser: Debian's headless Chromium, driven by Playwright.

The live server is started on 127.0.0.1 (port 0), the page is loaded, and the charts of
the run-health section must be there, visible, of a readable size and labelled; a
screenshot is saved as a test artifact (in the test's tmp dir, and in MYDATA_ARTIFACTS
when set). Playwright never downloads a browser here: it is pointed at /usr/bin/chromium.
Without Chromium or Playwright the test skips, unless MYDATA_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import httpx
import pytest

from batch.clock import FakeClock
from batch.dashboard import server
from batch.dashboard.server import ServerSettings, bound_addresses
from tests.conftest import REQUIRE_SERVICES
from tests.dashboard.conftest import BANK, NOW, Week
from tests.dashboard.health_rows import add_minutes

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("MYDATA_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def _need_browser() -> None:
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"chromium at {CHROMIUM}")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if missing:
        msg = "browser test needs " + " and ".join(missing)
        if REQUIRE_SERVICES:
            pytest.fail(msg + " (MYDATA_REQUIRE_SERVICES=1)")
        pytest.skip(msg)


def _outside_address() -> str | None:
    """One of this machine's non-loopback addresses, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


async def test_the_served_dashboard_renders_readable_charts_in_headless_chromium(
        week: Week, tmp_path: Path) -> None:
    _need_browser()
    from playwright.async_api import async_playwright

    await add_minutes(week.engine)
    running = await server.start(week.engine, FakeClock(NOW),
                                 ServerSettings(port=0, refresh_seconds=600))
    shot = tmp_path / "dashboard.png"
    try:
        assert bound_addresses(running) == ["127.0.0.1"]
        outside = _outside_address()
        if outside is not None:  # the same port on another interface: nobody answers
            async with httpx.AsyncClient(timeout=3) as client:
                with pytest.raises(httpx.ConnectError):
                    await client.get(f"http://{outside}:{running.port}/")
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
                args=FLAGS, viewport={"width": 1280, "height": 900})
            try:
                page = await context.new_page()
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text)
                        if m.type == "error" else None)
                response = await page.goto(running.url, wait_until="load")
                assert response is not None and response.status == 200
                section = page.locator("#run-health")
                await section.scroll_into_view_if_needed()
                charts = section.locator("svg.chart")
                assert await charts.count() == 18  # 6 per provider, 3 providers
                for i in range(await charts.count()):
                    chart = charts.nth(i)
                    box = await chart.bounding_box()
                    assert box is not None and box["width"] >= 300 and box["height"] >= 40, box
                    label = await chart.get_attribute("aria-label")
                    assert label and label.strip()
                bank = section.locator(f'details[data-provider="{BANK}"]')
                assert await bank.locator("polyline").count() >= 2  # ratio and latency lines
                assert await bank.locator("rect").count() > 24
                text = await section.inner_text()
                assert "Planned vs started per minute" in text
                assert "Backlog: dead letters" in text
                assert not errors, errors  # e.g. a CSP violation
                await page.screenshot(path=str(shot), full_page=True)
                await section.screenshot(path=str(tmp_path / "run-health.png"))
            finally:
                await context.close()
    finally:
        await running.stop()
    _keep(tmp_path, shot)


def _keep(tmp_path: Path, shot: Path) -> None:
    """The screenshots are the artifact: kept in tmp_path, copied to MYDATA_ARTIFACTS."""
    assert shot.stat().st_size > 10_000
    artifacts = os.environ.get("MYDATA_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        for name in (shot.name, "run-health.png"):
            shutil.copy(tmp_path / name, Path(artifacts) / name)
