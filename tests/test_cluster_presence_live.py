"""Presence on a Redis Cluster: the same live basics on a single Redis and on a local cluster, and a
master killed under load.

`fabric` (tests/conftest.py) runs each test twice: on the suite's single Redis, and with
RELAY_REDIS_CLUSTER_NODES alone, where the channel layer and presence both run on the cluster (3 masters, 3 replicas:
devtools/redis_cluster.py): every presence script goes to the master of its bucket's slot, and
every transition is published through the layer after its script (docs/scaling.md).
"""

import asyncio
import itertools
import time

import pytest

from presence.scripts import presence_key
from tests.support import (
    GRACE,
    REFRESH,
    TTL,
    WAIT,
    add_channel,
    add_user,
    barrier,
    close_all,
    connect,
    heard,
    http,
    lines,
    logged,
    on_cluster,
    states,
    timings,
    until,
)

pytestmark = pytest.mark.live


async def test_offline_after_the_grace_and_a_reconnect_inside_it_is_invisible(live_instances, acme, fabric, closing):
    a, b = live_instances(2, **fabric(**timings()))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    assert await heard(linh, "tuan", 1) == ["online"]
    await tuan.close()
    await asyncio.sleep(GRACE / 3000)
    back = await closing(connect(a, acme, "tuan"))
    # b's grace check decided "still online"; only then can silence be asserted.
    await logged(b, "presence.suppressed", user="tuan", state="offline", reason="a connection is still open somewhere")
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    closed_at = time.monotonic()
    await back.close()
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    assert time.monotonic() - closed_at >= GRACE / 1000
    second = await barrier(b, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    # One of each in all: b's connect said `online`, a's last close `offline`.
    await logged(a, "presence.published", user="tuan", state="offline")
    assert [line["state"] for line in lines([b], "presence.published", user="tuan")] == ["online"]
    assert [line["state"] for line in lines([a], "presence.published", user="tuan")] == ["offline"]
    await close_all(linh, probe, second)


async def test_a_killed_instances_user_goes_offline_once(live_instances, acme, fabric, closing):
    a, b = live_instances(2, **fabric(**timings()))
    linh = await closing(connect(a, acme, "linh"))
    await closing(connect(b, acme, "tuan"))
    await heard(linh, "tuan", 1)
    b.kill()
    killed_at = time.monotonic()
    # The reaper of a, a script on the master of tuan's bucket, decides; a publishes.
    assert await heard(linh, "tuan", 2, timeout=(TTL + GRACE + REFRESH) / 1000 + WAIT) == ["online", "offline"]
    assert time.monotonic() - killed_at >= (TTL - REFRESH) / 1000
    await logged(a, "presence.published", user="tuan", state="offline")
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    assert [line["state"] for line in lines([a], "presence.published", user="tuan")] == ["offline"]
    await close_all(linh, probe)


async def test_messages_and_membership_changes_cross_instances(live_instances, acme, fabric, closing):
    settings = fabric(**timings())
    a, b = live_instances(2, **settings)
    redis = "redis_cluster" if "RELAY_REDIS_CLUSTER_NODES" in settings else "redis"
    assert http("GET", f"{a.http_url}/readyz") == (200, {"status": "ok", "checks": {"database": "ok", redis: "ok"}})
    await add_user(acme, "mai")
    await add_user(acme, "an")
    ops = await add_channel(acme, "ops", "public", ("mai", "an"))
    linh = await closing(connect(a, acme, "linh"))
    an = await closing(connect(a, acme, "an"))
    tuan = await closing(connect(b, acme, "tuan"))
    mai = await closing(connect(b, acme, "mai"))
    assert await heard(linh, "tuan", 1) == ["online"]
    assert "linh" in tuan.of_type("presence.snapshot")[0]["online"]
    fleet = str(acme.channels["fleet"].id)
    assert (await linh.send_and_ack({"idem_key": "k-1", "channel": fleet, "text": "from a"}))["type"] == "message.ack"
    assert (await tuan.next_of("message.created"))["text"] == "from a"
    # Added through the other instance's API: linh's connection joins ops, hears mai (online on b)
    # and mai's messages; the channel's presence lists both.
    status, _ = http("PUT", f"{b.http_url}/v1/channels/{ops.id}/members/linh", api_key=acme.api_key)
    assert status == 201
    assert await heard(linh, "mai", 1) == ["online"]
    start = len(linh.frames)
    assert (await mai.send_and_ack({"idem_key": "k-2", "channel": str(ops.id), "text": "hi"}))["type"] == "message.ack"
    assert (await linh.next_of("message.created", after=start))["text"] == "hi"
    status, body = http("GET", f"{a.http_url}/v1/channels/{ops.id}/presence", api_key=acme.api_key)
    assert (status, body["online"]) == (200, ["an", "linh", "mai"])
    # Removed again: mai's departure from ops reaches an (still a member), not linh.
    status, _ = http("DELETE", f"{b.http_url}/v1/channels/{ops.id}/members/linh", api_key=acme.api_key)
    assert status == 204
    await mai.close()
    assert await heard(an, "mai", 2) == ["online", "offline"]
    probe = await barrier(a, acme, [an], channel="ops")
    assert states(linh, "mai") == ["online"]
    await close_all(linh, an, tuan, probe)


@pytest.mark.cluster
async def test_a_presence_master_killed_under_load_makes_no_false_offline_and_a_leaver_is_announced_once(
    live_instances, acme, redis_cluster, closing
):
    # A TTL longer than the failover (about 2 s here): the keys outlive it on the promoted replica.
    ttl, refresh = 6000, 500
    a, b = live_instances(2, **on_cluster(redis_cluster, **timings(ttl=ttl, refresh=refresh)))
    environment = str(acme.environment.id)
    steady = [f"user-{n}" for n in range(12)]
    victim = redis_cluster.master_of(presence_key(environment, steady[0]))
    # A user whose presence keys live on the master that dies, leaving while it is down.
    leaver = next(
        name
        for name in (f"leaver-{n}" for n in itertools.count())
        if redis_cluster.master_of(presence_key(environment, name)).port == victim.port
    )
    for user_id in (*steady, leaver):
        await add_user(acme, user_id, ("general",))
    linh = await closing(connect(a, acme, "linh"))
    held = [await closing(connect(a if n % 2 else b, acme, user_id)) for n, user_id in enumerate(steady)]
    going = await closing(connect(b, acme, leaver))
    tuan = await closing(connect(b, acme, "tuan"))
    for user_id in (*steady, leaver, "tuan"):
        assert await heard(linh, user_id, 1) == ["online"]
    general = str(acme.channels["general"].id)
    stop = asyncio.Event()

    async def load() -> None:
        # Messages keep flowing (and every instance keeps refreshing its users) through the kill.
        for n in itertools.count():
            if stop.is_set():
                return
            await tuan.send_and_ack({"idem_key": f"load-{n}", "channel": general, "text": f"load {n}"})
            await asyncio.sleep(0.05)

    loading = asyncio.ensure_future(load())
    killing = asyncio.ensure_future(asyncio.to_thread(redis_cluster.kill_master, victim))
    try:
        await until(lambda: not victim.running)
        await going.close()
        await killing
    finally:
        stop.set()
        await loading
        await killing
        await asyncio.to_thread(redis_cluster.restart, victim)
    # Announced once, by whichever script (the grace check, or the reaper after the TTL) decided.
    assert await heard(linh, leaver, 2, timeout=(ttl + GRACE + 2 * refresh) / 1000 + WAIT) == ["online", "offline"]
    probe = await barrier(a, acme, [linh])
    assert {user_id: states(linh, user_id) for user_id in (*steady, "tuan")} == {
        user_id: ["online"] for user_id in (*steady, "tuan")
    }
    assert states(linh, leaver) == ["online", "offline"]
    # One `offline` published in all (by b's grace check or by a reaper), beside b's one `online`.
    assert sorted(line["state"] for line in lines([a, b], "presence.published", user=leaver)) == ["offline", "online"]
    # The failover was seen: some presence call failed against the dead master.
    assert lines([a, b], "presence.failed")
    await close_all(linh, *held, tuan, probe)
