"""Rich presence across two real Daphne processes (docs/contract.md, Rich presence).

The cast (tests/conftest.py): in acme, linh and tuan share "fleet" and "general" (two channels,
so every "once" below is also "once however many channels"); hermit shares nothing; globex has
its own linh and zed. linh is the watcher, tuan the subject; they sit on different instances.

Every "nothing else arrived" is asserted after a barrier (tests/support.py): a probe's `online`,
published after anything ruled out, has reached the watcher.
"""

import json
from datetime import UTC, datetime, timedelta

import pytest
from channels.db import database_sync_to_async

from presence.keys import user_bucket
from presence.scripts import channel_online_key, deadlines_key, member, presence_key
from relay.models import Environment
from tests.support import (
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
    states,
    timings,
    until,
)

pytestmark = pytest.mark.live

BUSY = {"status": "busy", "text": "in a meeting", "emoji": ":calendar:"}


def statuses(client: WsClient, user: str) -> list[dict]:
    """The `presence.status` payloads `client` received about `user`."""
    return [payload for payload in client.of_type("presence.status") if payload["user"] == user]


async def status_count(client: WsClient, user: str, count: int) -> list[dict]:
    await client.wait_for(lambda c: len(statuses(c, user)) >= count, WAIT)
    return statuses(client, user)


def in_(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def open_with(instance, tenant, user: str, query: str = "") -> WsClient:
    client = await WsClient.open(instance.ws_url(tenant.token(user)) + query)
    await client.next_of("presence.snapshot", timeout=WAIT)
    return client


def user_presence(instance, tenant, user: str) -> dict:
    status, body = http("GET", f"{instance.http_url}/v1/users/{user}/presence", api_key=tenant.api_key)
    assert status == 200, body
    return body


# ── status ───────────────────────────────────────────────────────────────────
async def test_a_status_set_on_one_instance_reaches_a_watcher_on_the_other_once(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    tuan_phone = await open_with(b, acme, "tuan", "&device=mobile")
    tuan_laptop = await open_with(a, acme, "tuan", "&device=desktop")
    assert await heard(linh, "tuan", 1) == ["online"]

    await tuan_phone.send("presence.set", BUSY)
    (seen,) = await status_count(linh, "tuan", 1)
    assert seen == {"user": "tuan", **BUSY, "until": None, "idle": False}
    # Both of the user's own devices, the sender's included, hear it with `invisible`.
    own = {**seen, "invisible": False}
    assert (await status_count(tuan_phone, "tuan", 1)) == [own]
    assert (await status_count(tuan_laptop, "tuan", 1)) == [own]

    probe = await barrier(b, acme, [linh, tuan_phone, tuan_laptop])
    assert statuses(linh, "tuan") == [seen]  # once, though they share two channels
    assert statuses(tuan_laptop, "tuan") == [own]
    # A watcher that connects later reads it in its snapshot.
    later = await connect(b, acme, "linh")
    snapshot = later.of_type("presence.snapshot")[0]
    assert snapshot["status"]["tuan"] == {**BUSY, "until": None, "idle": False}
    assert set(snapshot["status"]) == set(snapshot["online"])
    # The backend sees both devices.
    truth = user_presence(a, acme, "tuan")
    assert truth["status"] == "busy" and truth["invisible"] is False and truth["state"] == "online"
    assert sorted(c["device"] for c in truth["connections"]) == ["desktop", "mobile"]
    await close_all(linh, tuan_phone, tuan_laptop, probe, later)


async def test_put_status_tells_watchers_and_the_users_connections_as_if_sent(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await heard(linh, "tuan", 1)
    status, body = http("PUT", f"{a.http_url}/v1/users/tuan/status", {"status": "away", "text": "lunch"}, acme.api_key)
    assert status == 200
    assert body == {"user": "tuan", "status": "away", "text": "lunch", "emoji": "", "until": None} | {
        "idle": False,
        "invisible": False,
    }
    assert (await status_count(linh, "tuan", 1))[0]["status"] == "away"
    assert (await status_count(tuan, "tuan", 1))[0]["invisible"] is False
    probe = await barrier(a, acme, [linh, tuan])
    assert len(statuses(linh, "tuan")) == 1 and len(statuses(tuan, "tuan")) == 1
    await close_all(linh, tuan, probe)


async def test_status_survives_reconnects_a_restart_and_a_redis_restarted_empty(live_instances, acme, redis_client):
    (a,) = live_instances(1, **timings())
    tuan = await connect(a, acme, "tuan")
    await tuan.send("presence.set", BUSY)
    await status_count(tuan, "tuan", 1)
    await tuan.close()
    a.stop()
    redis_client.flushall()
    (b,) = live_instances(1, **timings())
    tuan = await connect(b, acme, "tuan")
    linh = await connect(b, acme, "linh")
    assert linh.of_type("presence.snapshot")[0]["status"]["tuan"] == {**BUSY, "until": None, "idle": False}
    assert tuan.of_type("presence.snapshot")[0]["status"]["tuan"]["status"] == "busy"
    await close_all(linh, tuan)


async def test_an_expiry_is_announced_once_with_two_instances(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await heard(linh, "tuan", 1)
    await tuan.send("presence.set", {**BUSY, "until": in_(1.5)})
    (busy,) = await status_count(linh, "tuan", 1)
    assert busy["status"] == "busy" and busy["until"].endswith("Z")
    expired = await status_count(linh, "tuan", 2)
    assert expired[1] == {"user": "tuan", "status": "available", "text": "", "emoji": "", "until": None, "idle": False}
    assert (await status_count(tuan, "tuan", 2))[1]["status"] == "available"
    probe = await barrier(a, acme, [linh, tuan])
    assert len(statuses(linh, "tuan")) == 2
    assert len(lines([a, b], "presence.status_expired", user="tuan")) == 1
    await close_all(linh, tuan, probe)


# ── invisible ────────────────────────────────────────────────────────────────
async def test_invisible_then_visible_is_offline_then_online_and_nothing_else(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await heard(linh, "tuan", 1)
    fleet = acme.channels["fleet"].id

    await tuan.send("presence.set", {"invisible": True})
    assert await heard(linh, "tuan", 2) == ["online", "offline"]  # at once, without the grace
    (own,) = await status_count(tuan, "tuan", 1)
    assert own["invisible"] is True
    # Absent from channel presence and from a new watcher's snapshot; the backend sees the truth.
    assert http("GET", f"{a.http_url}/v1/channels/{fleet}/presence", api_key=acme.api_key)[1]["online"] == ["linh"]
    other = await connect(a, acme, "linh")
    assert "tuan" not in other.of_type("presence.snapshot")[0]["online"]
    truth = user_presence(b, acme, "tuan")
    assert truth["state"] == "online" and truth["invisible"] is True and truth["last_seen_at"] is not None
    # The invisible user still receives everything.
    await linh.send_and_ack({"idem_key": "k1", "channel": str(fleet), "text": "hello"})
    assert (await tuan.next_of("message.created"))["text"] == "hello"

    await tuan.send("presence.set", {"invisible": False})
    assert await heard(linh, "tuan", 3) == ["online", "offline", "online"]
    probe = await barrier(a, acme, [linh, other, tuan])
    assert states(linh, "tuan") == ["online", "offline", "online"]
    assert statuses(linh, "tuan") == []  # the defaults: no status frame follows the online
    assert states(tuan, "tuan") == ["online"]  # their own connection was never told they left
    await close_all(linh, other, tuan, probe)


async def test_invisible_users_close_tells_nobody_and_their_visible_return_says_online_then_status(
    live_instances, acme
):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await tuan.send("presence.set", {**BUSY, "invisible": True})
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    await tuan.close()
    await logged(b, "presence.published", user="tuan", state="offline")
    tuan = await connect(a, acme, "tuan")  # connects invisible: nobody hears it
    await status_count(tuan, "tuan", 1)  # told it is invisible
    await tuan.send("presence.set", {"invisible": False})
    assert await heard(linh, "tuan", 3) == ["online", "offline", "online"]
    (after,) = await status_count(linh, "tuan", 1)
    assert after["status"] == "busy"
    frames = [f for f in linh.frames if f["payload"].get("user") == "tuan"]
    assert [f["type"] for f in frames][-2:] == ["presence.changed", "presence.status"]  # never ahead of online
    await close_all(linh, tuan)


@database_sync_to_async
def set_large_room_members(tenant, members: int) -> None:
    Environment.objects.filter(id=tenant.environment.id).update(large_room_members=members)


@pytest.fixture
async def hall(acme):
    """A large channel: five members, above the environment's `large_room_members` of 3."""
    for user_id in ("an", "binh", "mai"):
        await add_user(acme, user_id)
    await set_large_room_members(acme, 3)
    return await add_channel(acme, "hall", "public", ("an", "binh", "linh", "mai", "tuan"))


def occupancy(client: WsClient, channel) -> list[int]:
    return [frame["online"] for frame in client.of_type("presence.occupancy") if frame["channel"] == str(channel.id)]


def page(instance, tenant, channel, **query: object) -> dict:
    arguments = "&".join(f"{name}={value}" for name, value in query.items())
    url = f"{instance.http_url}/v1/channels/{channel.id}/presence?{arguments}"
    status, body = http("GET", url, api_key=tenant.api_key)
    assert status == 200, body
    return body


async def refreshed(redis_client, tenant, user: str, times: int = 2) -> None:
    """Wait until the instance holding `user` has refreshed `times` more times (their deadline moved on)."""
    environment_id = str(tenant.environment.id)
    name, deadlines = member(environment_id, user), deadlines_key(user_bucket(environment_id, user))
    for _ in range(times):
        before = redis_client.zscore(deadlines, name)
        await until(lambda before=before: (redis_client.zscore(deadlines, name) or 0) > (before or 0))


async def test_an_invisible_user_is_not_counted_nor_listed_and_counts_again_once_visible(
    live_instances, acme, hall, redis_client
):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    mai = await connect(b, acme, "mai")
    an_here = await connect(b, acme, "an")
    an_there = await connect(a, acme, "an")
    await linh.wait_for(lambda c: occupancy(c, hall)[-1:] == [3])

    await an_here.send("presence.set", {"invisible": True})
    # Like an `offline`: the count drops ...
    await linh.wait_for(lambda c: occupancy(c, hall)[-1:] == [2])
    # ... and stays down: instance a, which holds an's other connection and heard of the change,
    # refreshes without counting them (its refreshes would otherwise put them back).
    await refreshed(redis_client, acme, "linh")
    assert redis_client.zscore(channel_online_key(str(hall.id)), "an") is None
    assert redis_client.zscore(channel_online_key(str(hall.id)), "linh") is not None
    # A snapshot counts only visible members (linh, mai and tuan himself) ...
    tuan = await connect(a, acme, "tuan")
    assert tuan.of_type("presence.snapshot")[0]["occupancy"] == {str(hall.id): 3}
    # ... and a page of the channel's presence has no place for an (first by id, online).
    assert page(a, acme, hall, limit=1) == {"channel": str(hall.id), "online": ["linh"], "next_after": "linh"}
    assert page(b, acme, hall)["online"] == ["linh", "mai", "tuan"]

    await an_there.send("presence.set", {"invisible": False})
    # Like an `online`: counted again (linh, mai, tuan and an).
    await linh.wait_for(lambda c: occupancy(c, hall)[-1:] == [4])
    assert page(a, acme, hall, limit=1)["online"] == ["an"]
    probe = await barrier(a, acme, [linh])
    assert states(linh, "an") == []  # counted, never named: they share only hall
    await close_all(linh, mai, an_here, an_there, tuan, probe)


async def test_the_reaper_tells_watchers_of_a_dead_instances_invisible_user_nothing_more(
    live_instances, acme, redis_client, closing
):
    a, b = live_instances(2, **timings())
    await add_user(acme, "mai", ("fleet",))
    linh = await connect(a, acme, "linh")
    tuan = await closing(connect(b, acme, "tuan"))
    await closing(connect(b, acme, "mai"))
    await heard(linh, "tuan", 1)
    await heard(linh, "mai", 1)
    await tuan.send("presence.set", {"invisible": True})
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    b.kill()
    # Both are reaped by a: mai, visible, with her one `offline` ...
    assert await heard(linh, "mai", 2) == ["online", "offline"]
    await logged(a, "presence.published", user="tuan", state="offline")
    # ... tuan with nothing more: linh heard his `offline` when he turned invisible.
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    assert states(linh, "mai") == ["online", "offline"]
    # The backend's truth is that he left.
    truth = user_presence(a, acme, "tuan")
    assert (truth["state"], truth["invisible"], truth["connections"]) == ("offline", True, [])
    assert not redis_client.exists(presence_key(str(acme.environment.id), "tuan"))
    await close_all(linh, probe)


async def test_an_invisible_users_signals_reach_nobody_without_an_error_and_they_still_hear_others(
    live_instances, acme
):
    a, b = live_instances(2, **timings())
    fleet = str(acme.channels["fleet"].id)
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await tuan.send("presence.set", {"invisible": True})
    await heard(linh, "tuan", 2)
    await tuan.send("signal", {"channel": fleet, "name": "typing", "data": {"n": 1}})
    # The invisible user still hears the others' signals.
    await linh.send("signal", {"channel": fleet, "name": "typing"})
    assert [s["user"] for s in await tuan.wait_for(lambda c: c.of_type("signal"))] == ["linh"]

    await tuan.send("presence.set", {"invisible": False})
    assert await heard(linh, "tuan", 3) == ["online", "offline", "online"]
    await tuan.send("signal", {"channel": fleet, "name": "typing", "data": {"n": 2}})
    await linh.wait_for(lambda c: c.of_type("signal"))
    # The signal sent while invisible, published before this one, never reached linh.
    assert [s["data"] for s in linh.of_type("signal")] == [{"n": 2}]
    assert tuan.of_type("error") == []  # nothing told the sender their signal went nowhere
    await close_all(linh, tuan)


def admin_post(client, path: str, form: dict) -> int:
    """POST a Django admin form in this process (a staff member's browser); the status code."""
    return client.post(f"/admin/presence/userstatus/{path}", form).status_code


async def test_a_status_staff_save_in_admin_is_told_as_a_put_is(live_instances, acme, staff, close_presence_service):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    tuan_there = await connect(a, acme, "tuan")
    await heard(linh, "tuan", 1)
    post = database_sync_to_async(admin_post)
    tuan_pk = acme.users["tuan"].pk
    form = {"user": tuan_pk, "status": "busy", "text": "in a meeting", "emoji": "", "until_0": "", "until_1": ""}

    assert await post(staff, "add/", form) == 302
    (seen,) = await status_count(linh, "tuan", 1)
    assert seen == {"user": "tuan", **BUSY, "emoji": "", "until": None, "idle": False}
    for own in (tuan, tuan_there):
        assert (await status_count(own, "tuan", 1)) == [{**seen, "invisible": False}]

    # Invisible from admin: watchers hear `offline`, the user's own connections their status.
    assert await post(staff, f"{tuan_pk}/change/", form | {"invisible": "on"}) == 302
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    assert (await status_count(tuan_there, "tuan", 2))[1]["invisible"] is True
    # Refused like a bad `presence.set`: nothing changes, nobody is told.
    assert await post(staff, f"{tuan_pk}/change/", form | {"invisible": "on", "text": "x" * 141}) == 200
    # Deleted: the user reads as the defaults, visible again, and watchers are told so.
    assert await post(staff, f"{tuan_pk}/delete/", {"post": "yes"}) == 302
    assert await heard(linh, "tuan", 3) == ["online", "offline", "online"]
    probe = await barrier(a, acme, [linh, tuan, tuan_there])
    assert statuses(linh, "tuan") == [seen]  # the defaults follow the `online` with no status
    assert [s["invisible"] for s in statuses(tuan, "tuan")] == [False, True, False]
    assert states(tuan, "tuan") == ["online"]
    truth = user_presence(b, acme, "tuan")
    assert (truth["state"], truth["status"], truth["invisible"]) == ("online", "available", False)
    await close_all(linh, tuan, tuan_there, probe)


async def test_an_environment_without_invisibility_refuses_it_and_changes_nothing(live_instances, acme):
    a, b = live_instances(2, **timings())
    assert http("PATCH", f"{a.http_url}/v1/settings", {"allow_invisible": False}, acme.api_key)[0] == 200
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await tuan.send("presence.set", {"invisible": True, "status": "away"})
    error = await tuan.next_of("error")
    assert error == {"code": "forbidden", "message": error["message"], "type": "presence.set"}
    status, body = http("PUT", f"{a.http_url}/v1/users/tuan/status", {"invisible": True}, acme.api_key)
    assert status == 403 and body["error"]["code"] == "forbidden"
    probe = await barrier(a, acme, [linh, tuan])
    assert states(linh, "tuan") == ["online"] and statuses(linh, "tuan") == []
    truth = user_presence(a, acme, "tuan")
    assert truth["invisible"] is False and truth["status"] == "available"
    await close_all(linh, tuan, probe)


# ── idle ─────────────────────────────────────────────────────────────────────
async def test_idle_needs_every_device(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    phone = await open_with(a, acme, "tuan", "&device=mobile")
    laptop = await open_with(b, acme, "tuan")
    await heard(linh, "tuan", 1)
    await laptop.send("presence.activity", {"idle": True})
    probe = await barrier(a, acme, [linh, phone])
    assert statuses(linh, "tuan") == []  # the phone is still active
    assert sorted((c["device"], c["idle"]) for c in user_presence(a, acme, "tuan")["connections"]) == [
        ("mobile", False),
        ("web", True),
    ]
    await phone.send("presence.activity", {"idle": True})
    (idle,) = await status_count(linh, "tuan", 1)
    assert idle["idle"] is True
    await phone.send("presence.activity", {"idle": False})
    assert (await status_count(linh, "tuan", 2))[1]["idle"] is False
    assert [s["idle"] for s in await status_count(laptop, "tuan", 2)] == [True, False]
    await close_all(linh, phone, laptop, probe)


async def test_a_closed_active_connection_counts_until_the_grace_ends(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    phone = await open_with(a, acme, "tuan", "&device=mobile")
    laptop = await open_with(b, acme, "tuan")
    await laptop.send("presence.activity", {"idle": True})
    await phone.close()
    # After the grace the active phone stops counting: the user is idle, told once.
    (idle,) = await status_count(linh, "tuan", 1)
    assert idle["idle"] is True
    assert states(linh, "tuan") == ["online"]
    await close_all(linh, laptop)


# ── devices ──────────────────────────────────────────────────────────────────
async def test_an_unknown_device_is_an_error_after_the_snapshot_and_counts_as_web(live_instances, acme):
    (a,) = live_instances(1, **timings())
    tuan = await WsClient.open(a.ws_url(acme.token("tuan")) + "&device=toaster")
    error = await tuan.next_of("error", timeout=WAIT)
    types = [frame["type"] for frame in tuan.frames]
    assert types.index("error") == types.index("presence.snapshot") + 1
    assert error["code"] == "invalid_request"
    assert [c["device"] for c in user_presence(a, acme, "tuan")["connections"]] == ["web"]
    await tuan.close()


# ── last seen and presence.query ─────────────────────────────────────────────
async def test_query_answers_only_about_co_members_with_last_seen(live_instances, acme, globex):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    await linh.send("presence.query", {"users": ["tuan", "hermit", "zed", "nobody", "linh"]})
    result = (await linh.next_of("presence.result"))["users"]
    assert set(result) == {"tuan", "linh"}  # hermit shares nothing; zed is another tenant's
    assert result["tuan"] == {"state": "offline", "last_seen_at": None, "status": "available"} | {
        "text": "",
        "emoji": "",
        "until": None,
        "idle": False,
    }
    assert result["linh"]["state"] == "online"

    tuan = await connect(b, acme, "tuan")
    await heard(linh, "tuan", 1)
    await tuan.close()
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    start = len(linh.frames)
    await linh.send("presence.query", {"users": ["tuan"]})
    seen = (await linh.next_of("presence.result", after=start))["users"]["tuan"]
    assert seen["state"] == "offline"
    assert datetime.fromisoformat(seen["last_seen_at"]) <= datetime.now(UTC)
    assert user_presence(a, acme, "tuan")["last_seen_at"] == seen["last_seen_at"]

    assert http("PATCH", f"{a.http_url}/v1/settings", {"share_last_seen": False}, acme.api_key)[0] == 200
    start = len(linh.frames)
    await linh.send("presence.query", {"users": ["tuan"]})
    assert (await linh.next_of("presence.result", after=start))["users"]["tuan"]["last_seen_at"] is None
    await linh.close()


async def test_an_invisible_user_queries_as_offline_seen_when_they_turned_invisible(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await tuan.send("presence.set", {**BUSY, "invisible": True})
    await heard(linh, "tuan", 2)
    await linh.send("presence.query", {"users": ["tuan"]})
    queried = (await linh.next_of("presence.result"))["users"]["tuan"]
    assert queried["state"] == "offline" and queried["status"] == "available" and queried["idle"] is False
    assert queried["last_seen_at"] == user_presence(a, acme, "tuan")["last_seen_at"] is not None
    # The user reads their own truth.
    await tuan.send("presence.query", {"users": ["tuan"]})
    assert (await tuan.next_of("presence.result"))["users"]["tuan"]["state"] == "online"
    await close_all(linh, tuan)


# ── bad input and rate ───────────────────────────────────────────────────────
BAD_FRAMES = [
    ("presence.set", {}),
    ("presence.set", {"status": "sleeping"}),
    ("presence.set", {"status": None}),
    ("presence.set", {"text": "x" * 141}),
    ("presence.set", {"emoji": "x" * 33}),
    ("presence.set", {"text": "bell\u0007"}),
    ("presence.set", {"until": "2001-01-01T00:00:00Z"}),
    ("presence.set", {"until": "tomorrow"}),
    ("presence.set", {"until": "2099-01-01T00:00:00"}),
    ("presence.set", {"invisible": "yes"}),
    ("presence.set", {"status": "busy", "colour": "red"}),
    ("presence.set", ["busy"]),
    ("presence.activity", {}),
    ("presence.activity", {"idle": 1}),
    ("presence.activity", {"idle": True, "extra": 1}),
    ("presence.query", {"users": []}),
    ("presence.query", {"users": ["x"] * 101}),
    ("presence.query", {"users": [""]}),
    ("presence.query", {"users": "tuan"}),
    ("presence.query", {}),
    ("presence.status", {"user": "tuan"}),
]


async def test_every_malformed_frame_and_body_is_refused_and_changes_nothing(live_instances, acme):
    (a,) = live_instances(1, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(a, acme, "tuan")
    for frame_type, payload in BAD_FRAMES:
        start = len(tuan.frames)
        await tuan.send(frame_type, payload)
        error = await tuan.next_of("error", after=start)
        assert error["code"] == "invalid_frame", (frame_type, payload, error)
    for body in [{}, {"status": "x"}, {"until": "2001-01-01T00:00:00Z"}, {"text": None}, ["busy"]]:
        status, answer = http("PUT", f"{a.http_url}/v1/users/tuan/status", body, acme.api_key)
        assert status == 400, (body, answer)
    assert http("PUT", f"{a.http_url}/v1/users/nobody/status", BUSY, acme.api_key)[0] == 404
    # Nothing changed; a good frame afterwards works.
    probe = await barrier(a, acme, [linh, tuan])
    assert statuses(linh, "tuan") == [] and statuses(tuan, "tuan") == []
    truth = user_presence(a, acme, "tuan")
    assert (truth["status"], truth["text"], truth["idle"], truth["invisible"]) == ("available", "", False, False)
    await tuan.send("presence.set", {"status": "dnd"})
    assert (await status_count(linh, "tuan", 1))[0]["status"] == "dnd"
    await close_all(linh, tuan, probe)


async def test_more_than_ten_updates_in_ten_seconds_are_rate_limited(live_instances, acme):
    (a,) = live_instances(1, **timings())
    linh = await connect(a, acme, "linh")
    tuan = await connect(a, acme, "tuan")
    for index in range(10):
        await tuan.send("presence.activity", {"idle": index % 2 == 0})
    await tuan.send("presence.set", {"status": "away"})
    error = await tuan.next_of("error")
    assert error["code"] == "rate_limited" and error["type"] == "presence.set"
    assert 0 < error["retry_after_ms"] <= 10_000
    # The ten went through (the last says active), the eleventh changed nothing.
    await tuan.wait_for(lambda c: [s["idle"] for s in statuses(c, "tuan")][-1:] == [False])
    assert user_presence(a, acme, "tuan")["status"] == "available"
    # Another connection has its own allowance.
    other = await connect(a, acme, "tuan")
    await other.send("presence.set", {"status": "away"})
    await linh.wait_for(lambda c: any(s["status"] == "away" for s in statuses(c, "tuan")))
    await close_all(linh, tuan, other)


def test_frames_are_published(live_instances, acme):
    (a,) = live_instances(1, **timings())
    status, schema = http("GET", f"{a.http_url}/v1/schema/frames.json")
    assert status == 200
    text = json.dumps(schema)
    for name in ("presence.set", "presence.activity", "presence.query", "presence.status", "presence.result"):
        assert name in text
