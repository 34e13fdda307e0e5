"""Rich presence on the demo page, in a real browser: status, idle, invisible and last seen.

Two people in two browser contexts, as tests/test_browser.py drives them (its fixtures). Linh
sets "busy — in a meeting" for 5 minutes, goes idle, turns invisible; Tuan's window shows each
change, then "last seen" for Linh. The screenshots are kept under test-artifacts/rich-presence/.
"""

import pytest
from playwright.sync_api import Page, expect

from tests.support import Instance
from tests.test_browser import ARTIFACTS, WAIT_MS, chromium, dot, relays, sign_in  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.live, pytest.mark.browser]

# The page reports idle after this long without input (the demo's `?idle_ms=`; a minute by default).
IDLE_MS = 1500


def sign_in_idling(page: Page, instance: Instance, name: str) -> None:
    page.goto(f"{instance.http_url}/?idle_ms={IDLE_MS}")
    page.get_by_role("button", name=name, exact=True).click()
    expect(page.locator("#status")).to_have_attribute("data-connection", "connected", timeout=WAIT_MS)


def test_status_idle_invisible_and_last_seen_reach_the_other_window(chromium, relays):  # noqa: F811
    (relay,) = relays(1)
    tuan = chromium.open("tuan")
    sign_in(tuan, relay, "Tuan")
    linh = chromium.open("linh")
    sign_in_idling(linh, relay, "Linh")
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)

    linh.select_option("#status-choice", "busy")
    linh.fill("#status-text", "in a meeting")
    linh.select_option("#status-until", "300")
    linh.get_by_role("button", name="Set status").click()
    expect(dot(tuan, "linh")).to_have_attribute("data-status", "busy", timeout=WAIT_MS)
    expect(dot(tuan, "linh")).to_contain_text("in a meeting")
    expect(linh.locator("#own-status")).to_contain_text("busy — in a meeting until")

    # No input in Linh's window: it reports idle, and Tuan's window marks it.
    expect(dot(tuan, "linh")).to_have_attribute("data-idle", "true", timeout=WAIT_MS)
    expect(dot(tuan, "linh").locator("[data-idle-marker]")).to_have_text("idle")
    ARTIFACTS.joinpath("rich-presence").mkdir(parents=True, exist_ok=True)
    tuan.screenshot(path=str(ARTIFACTS / "rich-presence" / "status-and-idle.png"), full_page=True)

    linh.check("#status-invisible")
    linh.get_by_role("button", name="Set status").click()
    expect(linh.locator("#own-status")).to_contain_text("(invisible)", timeout=WAIT_MS)
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "offline", timeout=WAIT_MS)
    expect(dot(tuan, "linh")).to_contain_text("last seen just now", timeout=WAIT_MS)
    # Linh still sees herself online and Tuan too: she receives everything.
    expect(dot(linh, "tuan")).to_have_attribute("data-presence", "online")
    tuan.screenshot(path=str(ARTIFACTS / "rich-presence" / "last-seen.png"), full_page=True)
    linh.screenshot(path=str(ARTIFACTS / "rich-presence" / "invisible-self.png"), full_page=True)
