"""Presence across real Daphne processes on one Redis, with scaled timings.

The cast (tests/conftest.py): in acme, linh and tuan share "fleet" (private) and "general"
(public); hermit belongs to nothing. globex has its own linh and zed in "board". linh is the
usual watcher, tuan the usual subject.

Every "nothing arrived" is asserted after a BARRIER: a fresh probe user who shares a channel
with the watchers connects, and the test waits until every watcher heard the probe's `online`.
The probe was published after anything the assertion rules out, and one watcher's socket
delivers in publish order, so an unwanted frame would already be there. Where the unwanted
frame could only come from a timer, the test first waits for the instance's log line proving
that timer decided (e.g. `presence.suppressed`), then the barrier.
"""

import asyncio
import time

import pytest
from channels.layers import get_channel_layer

from devtools.embedded_redis import EmbeddedRedis, free_port
from presence import actions
from presence.fabric import group_name, transition_message
from presence.scripts import connections_key, marker_key, presence_key, user_deadlines_key, user_epoch_key
from tests.support import (
    CHECK,
    GRACE,
    MARGIN,
    REFRESH,
    TTL,
    WAIT,
    WsClient,
    add_channel,
    add_user,
    barrier,
    close_all,
    connect,
    heard,
    http,
    lines,
    logged,
    probe_id,
    states,
    timings,
    until,
)

pytestmark = pytest.mark.live


# ── who hears an arrival ──────────────────────────────────────────────────────
async def test_the_contracts_own_command_plain_daphne_serves_presence_across_instances(live_instances, acme, closing):
    # Everything else runs `relay.serve` (Daphne tuned); clients may deploy `daphne` itself.
    a, b = live_instances(2, server="daphne", **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    assert tuan.of_type("presence.snapshot")[0]["online"] == ["linh", "tuan"]
    assert await heard(linh, "tuan", 1) == ["online"]
    await tuan.close()
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    await logged(b, "presence.published", user="tuan", state="offline")
    await close_all(linh)


async def test_a_watcher_sharing_three_channels_gets_one_frame_from_another_instance(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    await add_channel(acme, "ops", "public", ("linh", "tuan"))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    assert await heard(linh, "tuan", 1) == ["online"]
    probe = await barrier(b, acme, [linh, tuan])
    assert states(linh, "tuan") == ["online"]
    # The subject hears itself, once too.
    assert states(tuan, "tuan") == ["online"]
    (line,) = lines([a, b], "presence.published", user="tuan")
    assert line == {"time": line["time"], "level": "info", "event": "presence.published", "user": "tuan"} | {
        "state": "online",
        "channels": 3,
    }
    await close_all(linh, tuan, probe)


async def test_a_second_connection_of_an_online_user_publishes_nothing(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    first = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    second = await closing(connect(a, acme, "tuan"))
    probe = await barrier(b, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    assert [line["reason"] for line in lines([a], "presence.suppressed", user="tuan")] == ["already online"]
    await close_all(linh, first, second, probe)


async def test_a_user_of_no_channel_reaches_nobody(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    hermit = await closing(connect(b, acme, "hermit"))
    probe = await barrier(b, acme, [linh])
    assert states(linh, "hermit") == []
    assert [(line["state"], line["channels"]) for line in lines([b], "presence.published", user="hermit")] == [
        ("online", 0)
    ]
    await close_all(linh, hermit, probe)


async def test_a_private_channel_hides_its_members_from_non_members(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    await add_user(acme, "mai")
    await add_channel(acme, "vault", "private", ("hermit", "mai"))
    linh = await closing(connect(a, acme, "linh"))
    mai = await closing(connect(a, acme, "mai"))
    hermit = await closing(connect(b, acme, "hermit"))
    # mai is in the vault and hears hermit; linh is not and does not, though the pipe works.
    assert await heard(mai, "hermit", 1) == ["online"]
    probe = await barrier(b, acme, [linh])
    assert states(linh, "hermit") == []
    await close_all(linh, mai, hermit, probe)


async def test_nothing_crosses_the_tenant_wall(live_instances, acme, globex, closing):
    a, b = live_instances(2, **timings())
    acme_linh = await closing(connect(a, acme, "linh"))
    zed = await closing(connect(b, globex, "zed"))
    tuan = await closing(connect(b, acme, "tuan"))
    assert await heard(acme_linh, "tuan", 1) == ["online"]
    probe = await barrier(a, globex, [zed], channel="board")
    # zed heard only globex people: himself and globex's probe, never acme's tuan or linh.
    assert {p["user"] for p in zed.of_type("presence.changed")} == {"zed", probe_id(probe)}
    await close_all(acme_linh, zed, tuan, probe)


async def test_the_same_user_id_in_two_tenants_is_two_people(live_instances, acme, globex, closing):
    a, b = live_instances(2, **timings())
    tuan = await closing(connect(a, acme, "tuan"))
    zed = await closing(connect(b, globex, "zed"))
    acme_linh = await closing(connect(a, acme, "linh"))
    assert await heard(tuan, "linh", 1) == ["online"]
    # globex's linh is not "already online" because acme's linh is: she gets her own online.
    globex_linh = await closing(connect(b, globex, "linh"))
    assert await heard(zed, "linh", 1) == ["online"]
    # acme's linh leaving is heard in acme and changes nothing for globex's linh.
    await acme_linh.close()
    assert await heard(tuan, "linh", 2) == ["online", "offline"]
    probe = await barrier(a, globex, [zed], channel="board")
    assert states(zed, "linh") == ["online"]
    board = globex.channels["board"]
    status, body = http("GET", f"{a.http_url}/v1/channels/{board.id}/presence", api_key=globex.api_key)
    assert (status, body["online"]) == (200, ["linh", probe_id(probe), "zed"])
    await close_all(tuan, zed, globex_linh, probe)


# ── the grace period ──────────────────────────────────────────────────────────
async def test_one_offline_after_the_grace_and_not_before(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    closed_at = time.monotonic()
    await tuan.close()
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    assert time.monotonic() - closed_at >= GRACE / 1000
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    await logged(b, "presence.published", user="tuan", state="offline")
    assert [line["state"] for line in lines([a, b], "presence.published", user="tuan")] == ["online", "offline"]
    await close_all(linh, probe)


@pytest.mark.parametrize("same_instance", [True, False], ids=["same-instance", "other-instance"])
async def test_a_reconnect_inside_the_grace_publishes_nothing(live_instances, acme, same_instance, closing):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    await tuan.close()
    await asyncio.sleep(GRACE / 3000)
    back = await closing(connect(b if same_instance else a, acme, "tuan"))
    # b's grace check decided "still online"; only then can silence be asserted.
    await logged(b, "presence.suppressed", user="tuan", state="offline", reason="a connection is still open somewhere")
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    await close_all(linh, back, probe)


async def test_a_reconnect_after_the_ttl_lapsed_but_inside_the_grace_publishes_nothing(live_instances, acme, closing):
    # TTL well below the grace opens the gap the close's re-pin exists for (docs/presence.md, The races: the re-pin):
    # without it the key is gone by the reconnect, which wins the election and says `online` again.
    grace, ttl, refresh = 2000, 500, 150
    a, b = live_instances(2, **timings(grace=grace, ttl=ttl, refresh=refresh))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    await tuan.close()
    await asyncio.sleep(2 * ttl / 1000)
    back = await closing(connect(b, acme, "tuan"))
    assert [line["reason"] for line in lines([b], "presence.suppressed", user="tuan", state="online")] == [
        "already online"
    ]
    await logged(b, "presence.suppressed", user="tuan", state="offline", reason="a connection is still open somewhere")
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    await close_all(linh, back, probe)


async def test_five_connections_publish_nothing_until_the_last_closes(live_instances, acme, closing):
    a, b = live_instances(2, **timings(RELAY_MAX_CONNECTIONS_PER_USER=5))
    linh = await closing(connect(a, acme, "linh"))
    sockets = [await closing(connect(a if index % 2 else b, acme, "tuan")) for index in range(5)]
    await heard(linh, "tuan", 1)
    await close_all(*sockets[:4])
    # a closed its last two: its check must have found tuan still online on b.
    await logged(a, "presence.suppressed", user="tuan", state="offline", reason="a connection is still open somewhere")
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    await sockets[4].close()
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    late = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    await close_all(linh, probe, late)


async def test_close_reopen_close_inside_one_window_is_one_decision_at_the_end(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    await tuan.close()
    await asyncio.sleep(GRACE / 3000)
    again = await closing(connect(b, acme, "tuan"))
    second_close = time.monotonic()
    await again.close()
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    # Decided at the end of the second window, not the first.
    assert time.monotonic() - second_close >= GRACE / 1000
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    await logged(b, "presence.published", user="tuan", state="offline")
    assert len(lines([b], "presence.published", user="tuan", state="offline")) == 1
    await close_all(linh, probe)


async def test_two_instances_closing_together_publish_one_offline(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    on_a = await closing(connect(a, acme, "tuan"))
    on_b = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    await asyncio.gather(on_a.close(), on_b.close())
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    # Both checks ran: one published, the other stood down.
    await until(lambda: lines([a, b], "presence.suppressed", user="tuan", state="offline"))
    await until(lambda: lines([a, b], "presence.published", user="tuan", state="offline"))
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    assert len(lines([a, b], "presence.published", user="tuan", state="offline")) == 1
    await close_all(linh, probe)


async def test_a_dozen_users_closing_at_once_get_one_offline_each(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    crowd = [f"crew-{index}" for index in range(12)]
    for user_id in crowd:
        await add_user(acme, user_id, ("general",))
    linh = await closing(connect(a, acme, "linh"))
    sockets = [await closing(connect(a if index % 2 else b, acme, user_id)) for index, user_id in enumerate(crowd)]
    for user_id in crowd:
        await heard(linh, user_id, 1)
    await asyncio.gather(*(socket.close() for socket in sockets))
    for user_id in crowd:
        await heard(linh, user_id, 2)
    probe = await barrier(a, acme, [linh])
    assert {user_id: states(linh, user_id) for user_id in crowd} == {u: ["online", "offline"] for u in crowd}
    await close_all(linh, probe)


# ── the connection limit ──────────────────────────────────────────────────────
async def test_the_limit_holds_across_instances_and_a_slot_frees_on_close(live_instances, acme, redis_client, closing):
    a, b = live_instances(2, **timings(RELAY_MAX_CONNECTIONS_PER_USER=3))
    linh = await closing(connect(a, acme, "linh"))
    held = [
        await closing(connect(a, acme, "tuan")),
        await closing(connect(a, acme, "tuan")),
        await closing(connect(b, acme, "tuan")),
    ]
    refused = await closing(WsClient.open(b.ws_url(acme.token("tuan"))))
    assert await refused.closed(timeout=WAIT) == 4429
    assert refused.frames == []
    assert redis_client.zcard(connections_key(str(acme.environment.id), "tuan")) == 3
    await held[0].close()
    fourth = await closing(connect(b, acme, "tuan"))
    assert fourth.of_type("connection.ack")[0]["user"] == "tuan"
    probe = await barrier(b, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    await close_all(linh, *held[1:], fourth, probe)


async def test_the_slots_of_a_killed_instance_free_after_the_ttl(live_instances, acme, closing):
    a, b = live_instances(2, **timings(RELAY_MAX_CONNECTIONS_PER_USER=2))
    on_b = [await closing(connect(b, acme, "tuan")), await closing(connect(b, acme, "tuan"))]
    refused = await closing(WsClient.open(a.ws_url(acme.token("tuan"))))
    assert await refused.closed(timeout=WAIT) == 4429
    b.kill()
    killed_at = time.monotonic()

    async def admitted() -> WsClient:
        while True:
            client = await closing(WsClient.open(a.ws_url(acme.token("tuan"))))
            await client.wait_for(lambda c: c.frames or c.close_code, WAIT)
            if client.close_code is None:
                return client
            await asyncio.sleep(0.1)

    back = await asyncio.wait_for(admitted(), WAIT)
    assert time.monotonic() - killed_at >= (TTL - REFRESH) / 1000
    await close_all(back, *on_b)


# ── no ghosts, no false departures ────────────────────────────────────────────
async def test_a_killed_instances_users_go_offline_from_a_survivor(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    b.kill()
    killed_at = time.monotonic()
    # Within TTL + grace + one refresh of the kill (plus the ceiling's slack for a loaded machine).
    assert await heard(linh, "tuan", 2, timeout=(TTL + GRACE + REFRESH) / 1000 + WAIT) == ["online", "offline"]
    # Not before the key could have expired: the last refresh was at most one interval ago.
    assert time.monotonic() - killed_at >= (TTL - REFRESH) / 1000
    # The frame can overtake the log line that follows its publish.
    await logged(a, "presence.published", user="tuan", state="offline")
    assert [line["state"] for line in lines([a], "presence.published", user="tuan")] == ["offline"]
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    await close_all(linh, tuan, probe)


async def test_a_reconnect_after_a_killed_instances_key_expired_says_nothing_new(
    live_instances, acme, redis_client, closing
):
    # A grace long enough that the reconnect surely lands between the key's expiry and the
    # reaper's decision (last refresh + TTL + grace).
    grace = 3000
    a, b = live_instances(2, **timings(grace=grace))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    assert await heard(linh, "tuan", 1) == ["online"]
    b.kill()
    key = presence_key(str(acme.environment.id), "tuan")
    await until(lambda: not redis_client.exists(key))
    back = await closing(connect(a, acme, "tuan"))
    # watchers last heard `online` and tuan is back: neither a second `online` nor, once his old
    # deadline has passed, an `offline` from the reaper.
    await logged(a, "presence.suppressed", user="tuan", reason=actions.NEVER_RETRACTED)
    await asyncio.sleep((grace + 2 * REFRESH) / 1000)
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    # His departure from here on is said as usual.
    await back.close()
    assert await heard(linh, "tuan", 2, timeout=(grace + MARGIN) / 1000 + WAIT) == ["online", "offline"]
    await close_all(linh, tuan, probe)


async def test_a_stopped_instance_publishes_nothing_after_and_a_survivor_decides(live_instances, acme, closing):
    # A TTL far beyond the test's waits: a slot that frees now was freed by the stop, not expired.
    a, b = live_instances(2, **timings(grace=1500, ttl=6000, RELAY_MAX_CONNECTIONS_PER_USER=1))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    held = await closing(connect(b, acme, "hermit"))
    await heard(linh, "tuan", 1)
    await tuan.close()
    # tuan's grace check is pending on b when b is stopped (SIGTERM): it is cancelled with b.
    await asyncio.sleep(0.2)
    b.stop()
    # b freed hermit's slot as it stopped, so his reconnect elsewhere is not refused for a TTL.
    hermit = await closing(connect(a, acme, "hermit"))
    assert await heard(linh, "tuan", 2, timeout=(6000 + 1500 + REFRESH) / 1000 + WAIT) == ["online", "offline"]
    await logged(a, "presence.published", user="tuan", state="offline")
    assert [line["state"] for line in lines([b], "presence.published", user="tuan")] == ["online"]
    assert [line["state"] for line in lines([a], "presence.published", user="tuan")] == ["offline"]
    # hermit's socket went with b, whose hooks found the store closing instead of failing under it.
    assert lines([b], "connection.opened", user="hermit")
    assert lines([b], "connection.hook_failed") == []
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    await close_all(linh, held, hermit, probe)


async def test_keys_deleted_under_a_live_user_are_re_elected_without_a_departure(
    live_instances, acme, redis_client, closing
):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    environment = str(acme.environment.id)
    redis_client.delete(
        presence_key(environment, "tuan"), connections_key(environment, "tuan"), user_deadlines_key(environment, "tuan")
    )
    await logged(b, "presence.suppressed", user="tuan", reason="key vanished under a live connection; re-electing")
    assert redis_client.exists(presence_key(environment, "tuan"))
    assert redis_client.zcard(connections_key(environment, "tuan")) == 1
    # Wait out a whole grace check and a reaper pass: still no departure.
    await asyncio.sleep((CHECK + 2 * REFRESH) / 1000)
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    await close_all(linh, tuan, probe)


async def test_an_offline_published_while_the_key_was_gone_is_followed_by_online(
    live_instances, acme, redis_client, closing
):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    environment = str(acme.environment.id)
    # What another instance's grace check leaves after finding the key gone and saying `offline`.
    redis_client.delete(presence_key(environment, "tuan"))
    redis_client.set(marker_key(environment, "tuan"), "1")
    assert await heard(linh, "tuan", 2) == ["online", "online"]
    assert not redis_client.exists(marker_key(environment, "tuan"))
    await close_all(linh, tuan)


async def test_a_presence_redis_restart_loses_no_live_user(live_instances, acme, closing):
    presence_redis = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        linh = await closing(connect(a, acme, "linh"))
        tuan = await closing(connect(b, acme, "tuan"))
        await heard(linh, "tuan", 1)
        presence_redis.stop()
        presence_redis.start()  # empty: persistence is off
        await logged(b, "presence.suppressed", user="tuan", reason="key vanished under a live connection; re-electing")
        await asyncio.sleep((CHECK + 2 * REFRESH) / 1000)
        probe = await barrier(a, acme, [linh])
        assert states(linh, "tuan") == ["online"]
        await close_all(linh, tuan, probe)
    finally:
        presence_redis.close()


# ── when the presence Redis is gone ───────────────────────────────────────────
async def test_with_the_presence_redis_unreachable_sockets_open_and_failures_are_logged(live_instances, acme, closing):
    (broken,) = live_instances(1, **timings(RELAY_PRESENCE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"))
    linh = await closing(connect(broken, acme, "linh"))
    assert linh.of_type("connection.ack")[0]["user"] == "linh"
    assert linh.of_type("presence.snapshot") == [{"online": [], "status": {}}]
    await linh.send_raw("not json")
    assert (await linh.next_of("error"))["code"] == "invalid_frame"
    # The rest of the instance works: the API answers, and messages flow both ways.
    status, _ = http("POST", f"{broken.http_url}/v1/tokens", {"user": "tuan"}, acme.api_key)
    assert status == 201
    tuan = await closing(connect(broken, acme, "tuan"))
    fleet = str(acme.channels["fleet"].id)
    await linh.send("message.send", {"idem_key": "k-1", "channel": fleet, "text": "still here?"})
    assert (await linh.next_of("message.ack"))["seq"] == 1
    created = await tuan.next_of("message.created")
    assert (created["user"], created["text"], created["seq"]) == ("linh", "still here?", 1)
    await asyncio.sleep(3 * REFRESH / 1000)
    await close_all(linh, tuan)
    failed = await logged(broken, "presence.failed", op="release")
    # The snapshot's read rides in the election's round trip, so it fails (and is logged) as "admit".
    assert {line["op"] for line in broken.events("presence.failed")} >= {"admit", "refresh", "release"}
    assert all(line["level"] == "error" and isinstance(line["error"], str) for line in failed)
    log = broken.log_path.read_text()
    assert "Traceback" not in log
    assert "exception" not in {key for line in broken.events() for key in line}


async def test_when_the_presence_redis_returns_the_next_transition_publishes(live_instances, acme, closing):
    presence_redis = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        linh = await closing(connect(a, acme, "linh"))
        presence_redis.stop()
        # tuan connects during the outage: acknowledged, and the failure logged.
        tuan = await closing(connect(b, acme, "tuan"))
        await logged(b, "presence.failed", op="admit")
        presence_redis.start()
        # Without restarting anything: tuan's refresh announces him, and a new arrival publishes.
        assert await heard(linh, "tuan", 1) == ["online"]
        await add_user(acme, "mai", ("general",))
        mai = await closing(connect(b, acme, "mai"))
        assert await heard(linh, "mai", 1) == ["online"]
        await close_all(linh, tuan, mai)
    finally:
        presence_redis.close()


# ── the fabric, the snapshot, membership ──────────────────────────────────────
async def test_a_malformed_fabric_message_is_dropped_and_logged_with_its_group(live_instances, acme, closing):
    (a,) = live_instances(1, **timings())
    linh = await closing(connect(a, acme, "linh"))
    fleet = str(acme.channels["fleet"].id)
    good = transition_message("ghost", "online", "6f1c1c7e-4d55-4a3c-9a3f-3f0b0f4c8a11", fleet)
    layer = get_channel_layer()
    await layer.group_send(group_name(fleet), {k: v for k, v in good.items() if k != "state"})
    await layer.group_send(group_name(fleet), {**good, "state": "away"})
    await layer.group_send(group_name(fleet), {**good, "unknown": True})
    await layer.group_send(group_name(fleet), good)
    assert await heard(linh, "ghost", 1) == ["online"]
    invalid = a.events("presence.invalid_payload")
    assert [(line["level"], line["subject"]) for line in invalid] == [("error", f"presence.{fleet}")] * 3
    await close_all(linh)
    await layer.flush()


async def test_snapshots_and_changes_converge_while_users_come_and_go(live_instances, acme, closing):
    a, b = live_instances(2, **timings(grace=300, margin=100, ttl=900, refresh=250, RELAY_MAX_CONNECTIONS_PER_USER=10))
    flappers = [f"flap-{index}" for index in range(4)]
    for user_id in flappers:
        await add_user(acme, user_id, ("general",))
    watchers: list[WsClient] = []
    open_now: dict[str, WsClient] = {}

    async def flap(round_: int) -> None:
        for index, user_id in enumerate(flappers):
            if (round_ + index) % 3 == 0 and user_id in open_now:
                await open_now.pop(user_id).close()
            elif user_id not in open_now:
                open_now[user_id] = await closing(WsClient.open((a if index % 2 else b).ws_url(acme.token(user_id))))

    # Watchers connect in the middle of the churn, so transitions race their snapshots.
    for round_ in range(6):
        await flap(round_)
        watchers.append(await closing(WsClient.open((a if round_ % 2 else b).ws_url(acme.token("linh")))))
        await asyncio.sleep(0.15)
    # Let every pending grace check decide, then read the truth.
    await asyncio.sleep(1.2)
    probe = await barrier(a, acme, watchers)
    general = acme.channels["general"]
    status, body = http("GET", f"{a.http_url}/v1/channels/{general.id}/presence", api_key=acme.api_key)
    assert status == 200
    truth = set(body["online"])
    assert truth >= set(open_now)
    for watcher in watchers:
        online = set(watcher.of_type("presence.snapshot")[0]["online"])
        for change in watcher.of_type("presence.changed"):
            (online.add if change["state"] == "online" else online.discard)(change["user"])
        assert online == truth
    await close_all(*watchers, *open_now.values(), probe)


async def test_removing_a_member_takes_effect_on_live_connections_at_once(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    await add_user(acme, "mai")
    await add_user(acme, "an")
    ops = await add_channel(acme, "ops", "public", ("linh", "mai", "an"))
    linh = await closing(connect(a, acme, "linh"))
    an = await closing(connect(a, acme, "an"))
    mai = await closing(connect(b, acme, "mai"))
    assert await heard(linh, "mai", 1) == ["online"]
    status, _ = http("DELETE", f"{b.http_url}/v1/channels/{ops.id}/members/linh", api_key=acme.api_key)
    assert status == 204
    # Removed: mai's departure from ops no longer reaches linh (an, still a member, hears it) ...
    await mai.close()
    assert await heard(an, "mai", 2) == ["online", "offline"]
    probe = await barrier(a, acme, [linh])
    assert states(linh, "mai") == ["online"]
    # ... and linh's own departure no longer goes to ops: tuan (general) hears it, an (ops) does not.
    tuan = await closing(connect(b, acme, "tuan"))
    await linh.close()
    assert await heard(tuan, "linh", 1) == ["offline"]
    ops_probe = await barrier(b, acme, [an], channel="ops")
    # (an may have heard linh's arrival: it raced an's own connect, and a late copy is harmless.)
    assert "offline" not in states(an, "linh")
    await close_all(an, probe, tuan, ops_probe)


async def test_a_member_added_through_the_api_and_the_channel_hear_each_other_at_once(live_instances, acme, closing):
    a, b = live_instances(2, **timings())
    await add_user(acme, "mai")
    await add_user(acme, "an")
    ops = await add_channel(acme, "ops", "public", ("mai", "an"))
    mai = await closing(connect(b, acme, "mai"))
    linh = await closing(connect(a, acme, "linh"))
    assert "mai" not in linh.of_type("presence.snapshot")[0]["online"]
    status, _ = http("PUT", f"{b.http_url}/v1/channels/{ops.id}/members/linh", api_key=acme.api_key)
    assert status == 201
    # mai, online on the other instance, is announced to linh's connection; an, offline, is not.
    assert await heard(linh, "mai", 1) == ["online"]
    # And linh to mai's, from the instance that served the request.
    assert await heard(mai, "linh", 1) == ["online"]
    await logged(b, "presence.announced", user="linh", watchers=2)
    # From then on ops's transitions reach both ways as any member's do.
    await mai.close()
    assert await heard(linh, "mai", 2) == ["online", "offline"]
    assert states(linh, "an") == []
    an = await closing(connect(b, acme, "an"))
    await linh.close()
    assert await heard(an, "linh", 1) == ["offline"]
    await close_all(an)


async def test_http_presence_answers_from_any_instance(live_instances, acme, globex, closing):
    a, b = live_instances(2, **timings())
    tuan = await closing(connect(b, acme, "tuan"))
    fleet = acme.channels["fleet"]
    for instance in (a, b):
        status, body = http("GET", f"{instance.http_url}/v1/channels/{fleet.id}/presence", api_key=acme.api_key)
        assert (status, body) == (200, {"channel": str(fleet.id), "online": ["tuan"], "next_after": None})
    status, body = http("GET", f"{a.http_url}/v1/channels/{fleet.id}/presence", api_key=globex.api_key)
    assert (status, body["error"]["code"]) == (404, "channel_not_found")
    await close_all(tuan)


async def test_a_first_connection_closed_before_any_refresh_is_decided_at_its_grace(
    live_instances, acme, redis_client, closing
):
    # Nobody else connected: no refresh renews the epoch that the first connect gave a TTL.
    (a,) = live_instances(1, **timings())
    redis_client.delete(user_epoch_key(str(acme.environment.id), "tuan"))
    tuan = await connect(a, acme, "tuan")
    await tuan.close()
    await logged(a, "presence.published", user="tuan", state="offline", timeout=CHECK / 1000 + WAIT)
    # Decided at the grace: the epoch outlived the check, which did not take it for lost data.
    assert lines([a], "presence.suppressed", user="tuan", reason=actions.EPOCH_CHANGED) == []
