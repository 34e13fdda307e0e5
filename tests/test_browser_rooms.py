"""Large channels in the browser: the client's counts, and the demo page showing them.

The demo page, two people in two browser contexts on two instances (tests/test_browser.py's
fixtures): the local environment's `large_room_members` is set to 3 through PATCH /v1/settings,
so "general" (linh, tuan, mai, an: four members) is large and "fleet" (linh, tuan) is not. Tuan's
window shows general's online count and fleet's dots. The screenshots are kept under
test-artifacts/large-rooms/.

The client alone against a scripted server: what a real Relay never sends (a malformed count, a
snapshot that stops counting a channel after a reconnect).
"""

import asyncio
import json

import pytest
from playwright.sync_api import Locator, Page, expect

from relay.models import ApiKey, Environment
from tests.scripted_relay import Connection
from tests.support import http
from tests.test_browser import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    GRACE_MS,
    WAIT_MS,
    chromium,
    dot,
    open_channel,
    relays,
    scripted_relay,
    sign_in,
)

pytestmark = [pytest.mark.live, pytest.mark.browser]

THRESHOLD = 3


@pytest.fixture
def api_key(relays) -> str:  # noqa: F811
    """An API key of the local environment, issued before the browser starts (it holds this thread's loop)."""
    return ApiKey.issue(Environment.objects.get(name="local"), label="large rooms test")[1]


def online_count(page: Page) -> Locator:
    """A large channel's line in the member list: "N online"."""
    return page.locator("#members [data-occupancy] .online-count")


# Runs inside the watcher's page: notes the wall-clock time of every change of the large channel's
# count, so "not before the grace" does not depend on when the test looks.
WATCH_COUNT = """() => {
    window.countChanges = [];
    let last = null;
    const note = () => {
        const count = document.querySelector("#members [data-occupancy]")?.dataset.occupancy ?? null;
        if (count !== last) window.countChanges.push({ count, at: Date.now() });
        last = count;
    };
    note();
    new MutationObserver(note).observe(document.getElementById("members"), {
        childList: true, subtree: true, attributes: true,
    });
}"""


def test_b_sees_a_large_channels_count_rise_and_fall_while_a_small_channel_shows_as_dot(api_key, chromium, relays):  # noqa: F811
    one, two = relays(2)
    status, body = http("PATCH", f"{one.http_url}/v1/settings", {"large_room_members": THRESHOLD}, api_key)
    assert (status, body["large_room_members"]) == (200, THRESHOLD)

    tuan = chromium.open("tuan")
    sign_in(tuan, two, "Tuan")
    open_channel(tuan, "general")
    expect(online_count(tuan)).to_have_text("1 online", timeout=WAIT_MS)
    expect(tuan.locator("#members [data-occupancy] .member-count")).to_have_text("of 4 members")
    # Counted, not named: no entry per member, beside the count that proves the list was drawn.
    expect(tuan.locator("#members [data-member]")).to_have_count(0)

    linh = chromium.open("linh")
    sign_in(linh, one, "Linh")
    expect(online_count(tuan)).to_have_text("2 online", timeout=WAIT_MS)
    open_channel(linh, "general")
    expect(online_count(linh)).to_have_text("2 online", timeout=WAIT_MS)
    ARTIFACTS.joinpath("large-rooms").mkdir(parents=True, exist_ok=True)
    tuan.screenshot(path=str(ARTIFACTS / "large-rooms" / "general-counted.png"), full_page=True)

    # fleet is small: Linh is named there, with her dot.
    open_channel(tuan, "fleet")
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)
    expect(tuan.locator("#members [data-occupancy]")).to_have_count(0)
    tuan.screenshot(path=str(ARTIFACTS / "large-rooms" / "fleet-named.png"), full_page=True)

    open_channel(tuan, "general")
    expect(online_count(tuan)).to_have_text("2 online")
    tuan.evaluate(WATCH_COUNT)
    # Taken before the tab closes, so the server's close (and its grace) starts later.
    closed_at = tuan.evaluate("Date.now()")
    linh.close()
    expect(online_count(tuan)).to_have_text("1 online", timeout=WAIT_MS)
    changes = tuan.evaluate("window.countChanges")
    assert [change["count"] for change in changes] == ["2", "1"], changes
    assert changes[1]["at"] - closed_at >= GRACE_MS, "the count fell before the grace had passed"
    open_channel(tuan, "fleet")
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "offline", timeout=WAIT_MS)
    expect(dot(tuan, "tuan")).to_have_attribute("data-presence", "online")

    # The threshold raised past general's four members: the open page names them, without a reload.
    status, _ = http("PATCH", f"{one.http_url}/v1/settings", {"large_room_members": 1000}, api_key)
    assert status == 200
    open_channel(tuan, "general")
    expect(dot(tuan, "tuan")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "offline")
    expect(tuan.locator("#members [data-occupancy]")).to_have_count(0)


def test_after_its_instance_dies_b_shows_no_count_and_then_the_count_it_missed(api_key, chromium, relays):  # noqa: F811
    one, two = relays(2)
    status, _ = http("PATCH", f"{one.http_url}/v1/settings", {"large_room_members": THRESHOLD}, api_key)
    assert status == 200
    tuan = chromium.open("tuan")
    sign_in(tuan, two, "Tuan")
    open_channel(tuan, "general")
    expect(online_count(tuan)).to_have_text("1 online", timeout=WAIT_MS)

    two.stop()
    expect(tuan.locator("#status")).to_have_attribute("data-connection", "disconnected", timeout=WAIT_MS)
    # Nobody's presence is known while disconnected: no number, and the dot goes grey.
    expect(online_count(tuan)).to_have_text("… online")
    expect(tuan.locator("#members [data-occupancy]")).to_have_attribute("data-presence", "offline")
    sign_in(chromium.open("linh"), one, "Linh")
    two.start()

    # The page reconnects by itself: the new snapshot brings the count that changed while it was away.
    expect(tuan.locator("#status")).to_have_attribute("data-connection", "connected", timeout=WAIT_MS)
    expect(online_count(tuan)).to_have_text("2 online", timeout=WAIT_MS)
    expect(tuan.locator("#members [data-occupancy]")).to_have_attribute("data-presence", "online")


HALL = "0b9e3c55-1d1f-4d9a-9a50-4cbb8d5ad101"
PLAZA = "0b9e3c55-1d1f-4d9a-9a50-4cbb8d5ad102"
ATRIUM = "0b9e3c55-1d1f-4d9a-9a50-4cbb8d5ad103"
# Runs in a page of the relay's origin: the client module, pointed at the scripted server.
RUN_COUNTING_CLIENT = """async ([url, channels]) => {
    const { RelayClient } = await import("/static/web/client.js");
    window.seen = { occupancy: [], closes: [], errors: [] };
    const cursor = Object.fromEntries(channels.map((channel) => [channel, 0]));
    const client = new RelayClient({ url, token: "t", cursor, retryBaseMs: 50, retryCapMs: 200 });
    client.addEventListener("occupancy", (event) => window.seen.occupancy.push(event.detail));
    client.addEventListener("disconnected", (event) => window.seen.closes.push(event.detail.code));
    client.addEventListener("relay-error", (event) => window.seen.errors.push(event.detail.code));
    window.client = client;
    await client.connect();
    window.seen.first = Object.fromEntries(client.occupancy);
}"""


def test_the_browser_client_keeps_counts_ignores_malformed_ones_and_rebuilds_them_on_reconnect(chromium, relays):  # noqa: F811
    junk = [
        {"channel": HALL, "online": "4"},
        {"channel": HALL, "online": -1},
        {"channel": HALL, "online": 2.5},
        {"channel": HALL, "online": None},
        {"online": 4},
        {"channel": 5, "online": 4},
        {"channel": PLAZA, "online": 7, "large": "no"},
        [HALL, 4],
    ]

    async def script(connection: Connection) -> None:
        ack = {"connection_id": "c1", "user": "linh", "channels": [HALL, PLAZA, ATRIUM]}
        await connection.send("connection.ack", ack)
        if len(server.connections) == 1:
            # A snapshot with a malformed count is ignored whole: the next one is the first.
            await connection.send("presence.snapshot", {"online": ["linh"], "occupancy": {HALL: "3"}})
            await connection.send("presence.snapshot", {"online": ["linh"], "occupancy": {HALL: 3, PLAZA: 7}})
            for payload in junk:
                await connection.send("presence.occupancy", payload)
            await connection.send("presence.occupancy", {"channel": HALL, "online": 4})
            # Plaza became small: its count ends.
            await connection.send("presence.occupancy", {"channel": PLAZA, "online": 7, "large": False})
            await connection.send("error", {"code": "internal", "message": "a barrier"})
            await asyncio.sleep(0.3)
            await connection.socket.close(4008)
            return
        # Back: hall's count is as it was (no event), atrium is counted now.
        await connection.send("presence.snapshot", {"online": ["linh"], "occupancy": {HALL: 4, ATRIUM: 1}})
        await connection.send("error", {"code": "internal", "message": "a barrier"})
        await connection.drain()

    (relay,) = relays(1)
    page = chromium.open("scripted")
    page.goto(f"{relay.http_url}/healthz")
    with scripted_relay(script) as server:
        page.evaluate(RUN_COUNTING_CLIENT, [server.url, [HALL, PLAZA, ATRIUM]])
        page.wait_for_function("window.seen.errors.length === 2", timeout=WAIT_MS)
        seen = page.evaluate("window.seen")
        assert seen["first"] == {HALL: 3, PLAZA: 7}
        assert seen["occupancy"] == [
            {"channel": HALL, "online": 4},
            {"channel": PLAZA, "online": None},
            {"channel": ATRIUM, "online": 1},
        ]
        assert seen["closes"] == [4008]
        assert page.evaluate("Object.fromEntries(window.client.occupancy)") == {HALL: 4, ATRIUM: 1}
        # The getter hands out a copy: a page that changes it changes nothing in the client.
        page.evaluate(f"window.client.occupancy.set({json.dumps(HALL)}, 99)")
        assert page.evaluate(f"window.client.occupancy.get({json.dumps(HALL)})") == 4
        page.evaluate("window.client.close()")
