"""The demo client in a real browser: two people, two browser contexts, live Daphne.

Who is who: the `local` environment `make run` creates. Linh and Tuan share "fleet"
and "general". Each signs in through the demo sign-in in their own browser context
(separate storage, separate sockets), as two people on two machines would.

Playwright's sync API keeps an event loop "running" in this thread while it is
started, and Django refuses database calls then: every database write happens in
the fixtures before the browser starts, and the test database is flushed after
the browser has stopped (fixture order sees to both).
"""

import asyncio
import itertools
import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from playwright.sync_api import Browser, Locator, Page, Request, expect, sync_playwright

from relay.models import Channel, User
from tests.chat_helpers import store_history
from tests.conftest import PHASE_REPORTS
from tests.scripted_relay import Connection, Script, ScriptedRelay, message
from tests.support import BASE_DIR, Instance

pytestmark = [pytest.mark.live, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
# The machine reaches nothing beyond package registries: without the background
# networking flags Chromium stalls on its own update and sync requests.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = BASE_DIR / "test-artifacts"
# Scaled presence timings: long enough that "not before the grace" is measurable
# on a loaded 2-core machine, short enough to keep the test quick.
GRACE_MS = 800
MARGIN_MS = 200
# Generous: other suites share the two cores, and a reconnect waits out a back-off.
WAIT_MS = 30_000
# Every socket's close code in the page's console log: a reconnect the test did not expect
# says why the socket before it closed (1006: the handshake failed or the connection dropped).
LOG_CLOSE_CODES = """
window.WebSocket = class extends window.WebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener("close", (event) => console.info(`websocket closed: ${event.code} ${this.url}`));
  }
};
"""


@dataclass
class Browsing:
    """One headless Chromium; each `open` is a new browser context (a separate person)."""

    browser: Browser
    pages: dict[str, Page] = field(default_factory=dict)
    console: dict[str, list[str]] = field(default_factory=dict)
    page_errors: list[str] = field(default_factory=list)

    def open(self, label: str) -> Page:
        context = self.browser.new_context(viewport={"width": 1100, "height": 700})
        context.add_init_script(LOG_CLOSE_CODES)
        page = context.new_page()
        lines = self.console.setdefault(label, [])
        page.on("console", lambda message: lines.append(f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: self.page_errors.append(f"{label}: {error}"))
        page.on("pageerror", lambda error: lines.append(f"uncaught: {error}"))
        self.pages[label] = page
        return page

    def keep_artifacts(self, directory: Path) -> None:
        """Save every open page's screenshot and every page's console log under `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        for label, page in self.pages.items():
            if not page.is_closed():
                page.screenshot(path=str(directory / f"{label}.png"), full_page=True)
        for label, lines in self.console.items():
            (directory / f"{label}.console.log").write_text("\n".join(lines) + "\n")


def failed(item: pytest.Item) -> bool:
    return any(report.failed for report in item.stash.get(PHASE_REPORTS, {}).values())


@pytest.fixture
def relays(live_instances: Callable[..., list[Instance]]) -> Callable[[int], list[Instance]]:
    """Start `count` Daphne instances serving the demo, on a test database holding the local environment."""
    call_command("setupdemo", stdout=StringIO())

    def start(count: int = 1) -> list[Instance]:
        return live_instances(
            count,
            RELAY_DEMO="1",
            RELAY_PRESENCE_GRACE_MS=str(GRACE_MS),
            RELAY_PRESENCE_MARGIN_MS=str(MARGIN_MS),
        )

    return start


@pytest.fixture
def chromium(
    request: pytest.FixtureRequest, relays: Callable[[int], list[Instance]], tmp_path: Path
) -> Iterator[Browsing]:
    """A headless Chromium; a failing test leaves its evidence in test-artifacts/.

    Each page's screenshot and console log, and the instances' logs (one JSON event a line,
    nothing secret).
    """
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    with sync_playwright() as playwright:
        browsing = Browsing(
            playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        )
        yield browsing
        if failed(request.node):
            artifacts = ARTIFACTS / re.sub(r"[^\w.-]+", "_", request.node.name)
            browsing.keep_artifacts(artifacts)
            # The relays' logs (live_instances writes them to this test's tmp_path): a close code
            # the page did not expect is explained there.
            for log in tmp_path.glob("*.log"):
                shutil.copy(log, artifacts / log.name)
        browsing.browser.close()
    if browsing.page_errors and not failed(request.node):
        pytest.fail("uncaught errors in the page:\n" + "\n".join(browsing.page_errors))


def sign_in(page: Page, instance: Instance, name: str) -> None:
    """Open the client on `instance`, sign in as the demo user `name`, wait for connection.ack."""
    page.goto(f"{instance.http_url}/")
    page.get_by_role("button", name=name, exact=True).click()
    expect(page.locator("#status")).to_have_attribute("data-connection", "connected", timeout=WAIT_MS)


def open_channel(page: Page, name: str) -> None:
    page.locator(f'[data-channel-name="{name}"]').click()
    expect(page.locator("#channel-name")).to_have_text(f"#{name}")


def dot(page: Page, user: str) -> Locator:
    """The member list entry of `user`; its data-presence is "online" or "offline"."""
    return page.locator(f'#members [data-member="{user}"]')


def send(page: Page, text: str) -> None:
    page.fill("#message-text", text)
    page.press("#message-text", "Enter")


def texts(page: Page) -> Locator:
    return page.locator("#messages li .text")


def test_b_sees_as_dot_turn_green_when_a_signs_in(chromium, relays):
    (relay,) = relays(1)
    tuan = chromium.open("tuan")
    sign_in(tuan, relay, "Tuan")
    # Tuan's own dot turning green proves presence frames reach the page, so Linh's
    # grey dot beside it means "offline", not "nothing arrived yet".
    expect(dot(tuan, "tuan")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "offline")

    sign_in(chromium.open("linh"), relay, "Linh")
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)


# Runs inside the watcher's page: notes the wall-clock time of every change of one
# member's dot, so "not before the grace" does not depend on when the test looks.
WATCH_DOT = """(user) => {
    window.dotChanges = [];
    let last = null;
    const note = () => {
        const presence = document.querySelector(`#members [data-member="${user}"]`)?.dataset.presence ?? null;
        if (presence !== last) window.dotChanges.push({ presence, at: Date.now() });
        last = presence;
    };
    note();
    new MutationObserver(note).observe(document.getElementById("members"), {
        childList: true, subtree: true, attributes: true,
    });
}"""


def test_b_sees_a_turn_grey_a_grace_after_a_closes_the_tab_and_not_before(chromium, relays):
    (relay,) = relays(1)
    linh, tuan = chromium.open("linh"), chromium.open("tuan")
    sign_in(tuan, relay, "Tuan")
    sign_in(linh, relay, "Linh")
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)
    tuan.evaluate(WATCH_DOT, "linh")

    # Taken before the tab closes, so the server's close (and its grace) starts later.
    closed_at = tuan.evaluate("Date.now()")
    linh.close()
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "offline", timeout=WAIT_MS)

    changes = tuan.evaluate("window.dotChanges")
    assert [change["presence"] for change in changes] == ["online", "offline"], changes
    assert changes[1]["at"] - closed_at >= GRACE_MS, "offline was shown before the grace had passed"
    expect(dot(tuan, "tuan")).to_have_attribute("data-presence", "online")


def test_a_message_sent_by_a_appears_at_b_as_text(chromium, relays):
    (relay,) = relays(1)
    linh, tuan = chromium.open("linh"), chromium.open("tuan")
    sign_in(linh, relay, "Linh")
    sign_in(tuan, relay, "Tuan")
    open_channel(linh, "general")
    open_channel(tuan, "general")
    # Message text is untrusted: it must arrive as text, never as markup.
    text = 'hello <b>Tuan</b> & <img src="x" onerror="window.injected = true">'
    send(linh, text)

    expect(texts(tuan)).to_have_text([text], timeout=WAIT_MS)
    expect(tuan.locator("#messages li .author")).to_have_text(["Linh"])
    expect(texts(linh)).to_have_text([text], timeout=WAIT_MS)
    assert tuan.locator("#messages b, #messages img").count() == 0
    assert tuan.evaluate("window.injected") is None


def test_b_sees_linh_is_typing_while_a_types_across_two_instances_and_not_after_her_message(chromium, relays):
    one, two = relays(2)
    linh, tuan = chromium.open("linh"), chromium.open("tuan")
    sign_in(linh, one, "Linh")
    sign_in(tuan, two, "Tuan")
    open_channel(linh, "general")
    open_channel(tuan, "general")
    linh.locator("#message-text").press_sequentially("hel")

    expect(tuan.locator("#typing")).to_have_text("Linh is typing…", timeout=WAIT_MS)
    # Tuan's signal comes after hers on the same channel: her own never came back, so she sees only his.
    tuan.locator("#message-text").press_sequentially("h")
    expect(linh.locator("#typing")).to_have_text("Tuan is typing…", timeout=WAIT_MS)
    linh.locator("#message-text").press_sequentially("lo")
    linh.press("#message-text", "Enter")
    expect(texts(tuan)).to_have_text(["hello"], timeout=WAIT_MS)
    expect(tuan.locator("#typing")).to_have_text("")


def test_after_a_drop_b_reconnects_and_gets_what_it_missed_once(chromium, relays):
    one, two = relays(2)
    linh, tuan = chromium.open("linh"), chromium.open("tuan")
    sign_in(linh, one, "Linh")
    sign_in(tuan, two, "Tuan")
    open_channel(linh, "general")
    open_channel(tuan, "general")
    send(linh, "before the drop")
    expect(texts(tuan)).to_have_text(["before the drop"], timeout=WAIT_MS)

    two.stop()
    expect(tuan.locator("#status")).to_have_attribute("data-connection", "disconnected", timeout=WAIT_MS)
    send(linh, "while Tuan was away")
    expect(texts(linh)).to_have_text(["before the drop", "while Tuan was away"], timeout=WAIT_MS)
    two.start()

    # The page reconnects by itself (back-off) with its cursor: the missed message
    # arrives, the one already shown is not repeated, and live ones follow.
    expect(tuan.locator("#status")).to_have_attribute("data-connection", "connected", timeout=WAIT_MS)
    expect(texts(tuan)).to_have_text(["before the drop", "while Tuan was away"], timeout=WAIT_MS)
    send(linh, "after the return")
    expect(texts(tuan)).to_have_text(["before the drop", "while Tuan was away", "after the return"], timeout=WAIT_MS)
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)


# The page's main thread busy for 1.5 s after each socket it opens, as while a page loads: it
# answers the server's close frame that much later (autobahn alone reset the connection after 1 s,
# and the page saw 1006).
BUSY_AFTER_CONNECT = """
window.WebSocket = class extends window.WebSocket {
  constructor(...args) {
    super(...args);
    const until = Date.now() + 1500;
    while (Date.now() < until) {}
  }
};
"""


@pytest.mark.parametrize("page_busy", [False, True], ids=["idle-page", "busy-page"])
def test_a_refused_token_signs_the_page_out_and_it_stops_reconnecting(chromium, relays, page_busy):
    (relay,) = relays(1)
    tuan = chromium.open("tuan")
    sign_in(tuan, relay, "Tuan")
    # A reload resumes the saved session; with a forged token the server closes 4401.
    tuan.evaluate("""() => {
        const session = JSON.parse(sessionStorage.getItem("relay.demo.session"));
        sessionStorage.setItem("relay.demo.session", JSON.stringify({ ...session, token: "forged" }));
    }""")
    if page_busy:
        tuan.context.add_init_script(BUSY_AFTER_CONNECT)
    sockets: list[str] = []
    tuan.on("websocket", lambda socket: sockets.append(socket.url))
    tuan.reload()

    expect(tuan.locator("#status")).to_have_attribute("data-connection", "signed-out", timeout=WAIT_MS)
    expect(tuan.locator("#status")).to_contain_text("refused the token")
    expect(tuan.get_by_role("button", name="Tuan", exact=True)).to_be_visible()
    # Well past the first back-off step (at most 500 ms): no second attempt was made.
    time.sleep(1.5)
    assert len(sockets) == 1, "\n".join([*sockets, *chromium.console["tuan"], relay.log_path.read_text()[-3000:]])
    assert tuan.evaluate("sessionStorage.getItem('relay.demo.session')") is None


def store_without_fanout(channel_name: str, author: str, count: int) -> None:
    """Store messages in a local channel and publish nothing, so the next live seq skips them.

    In another thread: Playwright's loop runs in this one, and Django refuses database calls here.
    """

    def store() -> None:
        try:
            channel = Channel.objects.get(environment__name="local", name=channel_name)
            store_history(channel, User.objects.get(environment=channel.environment, external_id=author), count)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(store).result()


def test_after_its_instance_dies_b_resumes_and_fills_a_skipped_seq_from_the_history(chromium, relays):
    one, two = relays(2)
    linh, tuan = chromium.open("linh"), chromium.open("tuan")
    sign_in(linh, one, "Linh")
    sign_in(tuan, two, "Tuan")
    open_channel(linh, "general")
    open_channel(tuan, "general")
    history_reads: list[Request] = []
    tuan.on("request", lambda request: "/messages?" in request.url and history_reads.append(request))
    send(linh, "before the crash")
    expect(texts(tuan)).to_have_text(["before the crash"], timeout=WAIT_MS)

    two.kill()
    expect(tuan.locator("#status")).to_have_attribute("data-connection", "disconnected", timeout=WAIT_MS)
    send(linh, "while Tuan was away")
    expect(texts(linh)).to_have_text(["before the crash", "while Tuan was away"], timeout=WAIT_MS)
    store_without_fanout("general", "linh", 1)
    two.start()
    # The resume brings both missed messages (seq 2, and seq 3 that no instance ever published).
    expect(tuan.locator("#status")).to_have_attribute("data-connection", "connected", timeout=WAIT_MS)
    expect(texts(tuan)).to_have_text(["before the crash", "while Tuan was away", "message 3"], timeout=WAIT_MS)
    assert history_reads == [], "the resume, not the history, brought what was missed"

    # Live, seq 4 is never published and seq 5 is: the page reads 4 from the history with its token.
    store_without_fanout("general", "linh", 1)
    send(linh, "after the gap")
    expected = ["before the crash", "while Tuan was away", "message 3", "message 4", "after the gap"]
    expect(texts(tuan)).to_have_text(expected, timeout=WAIT_MS)
    assert [item.get_attribute("data-seq") for item in tuan.locator("#messages li").all()] == ["1", "2", "3", "4", "5"]
    token = tuan.evaluate("JSON.parse(sessionStorage.getItem('relay.demo.session')).token")
    assert [(re.sub(r".*\?", "", r.url), r.headers["authorization"]) for r in history_reads] == [
        ("after=3&limit=1", f"Bearer {token}")
    ]
    expect(dot(tuan, "linh")).to_have_attribute("data-presence", "online", timeout=WAIT_MS)


@contextmanager
def scripted_relay(script: Script) -> Iterator[ScriptedRelay]:
    """A ScriptedRelay on its own event loop in a thread (Playwright's sync API holds this thread's)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ScriptedRelay(script)
    server.loop = loop  # for a test that waits on the server's coroutines
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


CHANNEL = "0b9e3c55-1d1f-4d9a-9a50-4cbb8d5ad001"
# Runs in a page of the relay's origin: the client module, pointed at the scripted server.
RUN_CLIENT = """async ([url, channel]) => {
    const { RelayClient } = await import("/static/web/client.js");
    window.seen = { messages: [], closes: [], errors: [] };
    const client = new RelayClient({
        url, token: "t", cursor: { [channel]: 0 }, gapWaitMs: 60000, retryBaseMs: 50, retryCapMs: 200,
    });
    client.addEventListener("message", (event) => window.seen.messages.push(event.detail.seq));
    client.addEventListener("disconnected", (event) => window.seen.closes.push(event.detail.code));
    client.addEventListener("relay-error", (event) => window.seen.errors.push(event.detail.code));
    window.client = client;
    await client.connect();
}"""


def test_the_browser_client_resumes_from_the_highest_contiguous_seq_after_a_4008(chromium, relays):
    junk = [
        "not json",
        json.dumps({"type": "presence.teleported", "payload": {}}),
        json.dumps({"type": "message.created", "payload": {"seq": "1"}}),
    ]

    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], ["linh"])
        if len(server.connections) == 1:
            for frame in junk:
                await connection.send_raw(frame)
            await connection.send("message.created", message(CHANNEL, 1))
            await connection.send("message.created", message(CHANNEL, 3))  # 2 is late: held, not shown
            await asyncio.sleep(0.5)
            await connection.socket.close(4008)  # a slow reader, cut loose: the client comes back
            return
        for seq in (2, 3, 4):  # the resume from the cursor, then a live one
            await connection.send("message.created", message(CHANNEL, seq))
        await connection.send("error", {"code": "internal", "message": "a handler failed"})
        await connection.drain()

    (relay,) = relays(1)
    page = chromium.open("scripted")
    page.goto(f"{relay.http_url}/healthz")
    with scripted_relay(script) as server:
        page.evaluate(RUN_CLIENT, [server.url, CHANNEL])
        page.wait_for_function("window.seen.errors.length === 1", timeout=WAIT_MS)
        seen = page.evaluate("window.seen")
        assert seen == {"messages": [1, 2, 3, 4], "closes": [4008], "errors": ["internal"]}
        assert [connection.cursor for connection in server.connections] == [{CHANNEL: 0}, {CHANNEL: 1}]
        assert server.history_requests == []
        page.evaluate("window.client.close()")


RUN_CLIENT_WITH = """async ([url, options]) => {
    const { RelayClient } = await import("/static/web/client.js");
    window.seen = [];
    window.client = new RelayClient({ url, token: "t", gapWaitMs: 60000, ...options });
    window.client.addEventListener("message", (event) => window.seen.push(event.detail.seq));
    await window.client.connect();
}"""


def test_the_browser_client_retries_a_server_that_acknowledges_then_closes_ever_more_slowly(chromium, relays):
    opened: list[float] = []

    async def ack_then_close(connection: Connection) -> None:
        opened.append(asyncio.get_running_loop().time())
        await connection.hello("linh", [CHANNEL], ["linh"])
        await connection.socket.close(1011, "resume_failed")

    (relay,) = relays(1)
    page = chromium.open("scripted")
    page.goto(f"{relay.http_url}/healthz")
    base_ms = 20
    with scripted_relay(ack_then_close) as server:
        page.evaluate(RUN_CLIENT_WITH, [server.url, {"cursor": {CHANNEL: 0}, "retryBaseMs": base_ms}])
        asyncio.run_coroutine_threadsafe(server.connection(6), server.loop).result(WAIT_MS / 1000)
        page.evaluate("window.client.close()")
    gaps = [later - earlier for earlier, later in itertools.pairwise(opened)]
    # Each wait is at least half its ceiling, and the ceiling doubles: the ack alone resets nothing.
    for failures, gap in enumerate(gaps[:6]):
        assert gap >= base_ms / 1000 * 2**failures / 2, (failures, gaps)


def test_the_browser_client_sends_a_cursor_too_long_for_a_url_as_the_first_frame(chromium, relays):
    cursor = {f"0b9e3c55-1d1f-4d9a-9a50-{n:012d}": 1 for n in range(400)} | {CHANNEL: 2}

    async def script(connection: Connection) -> None:
        first = await connection.next_frame()
        await connection.hello("linh", [CHANNEL], ["linh"])
        if first == {"type": "resume", "payload": {"cursor": cursor}}:
            await connection.send("message.created", message(CHANNEL, 3))
        await connection.drain()

    (relay,) = relays(1)
    page = chromium.open("scripted")
    page.goto(f"{relay.http_url}/healthz")
    with scripted_relay(script) as server:
        page.evaluate(RUN_CLIENT_WITH, [server.url, {"cursor": cursor}])
        page.wait_for_function("window.seen.length === 1", timeout=WAIT_MS)
        assert page.evaluate("window.seen") == [3]
        assert server.connections[0].query == {"token": "t", "resume": "frame", "device": "web"}
        page.evaluate("window.client.close()")


def test_the_browser_client_sends_again_what_was_refused_rate_limited(chromium, relays):
    async def limit_the_first(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], ["linh"])
        first = await connection.next_frame()
        await connection.send("error", {"code": "rate_limited", "message": "slow down", "retry_after_ms": 50})
        again = await connection.next_frame()
        if again == first:
            payload = again["payload"]
            ack = {"idem_key": payload["idem_key"], "id": "m-1", "channel": CHANNEL, "seq": 1}
            await connection.send("message.ack", ack)
        await connection.drain()

    (relay,) = relays(1)
    page = chromium.open("scripted")
    page.goto(f"{relay.http_url}/healthz")
    with scripted_relay(limit_the_first) as server:
        page.evaluate(RUN_CLIENT_WITH, [server.url, {"cursor": {CHANNEL: 0}}])
        ack = page.evaluate(f"window.client.send({json.dumps(CHANNEL)}, 'hello')")
        assert (ack["seq"], ack["channel"]) == (1, CHANNEL)
        assert [frame["type"] for frame in server.connections[0].received] == ["message.send", "message.send"]
        page.evaluate("window.client.close()")
