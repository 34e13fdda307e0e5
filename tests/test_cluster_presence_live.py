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
import redis

from devtools.embedded_redis import EmbeddedRedis
from devtools.redis_cluster import EmbeddedRedisCluster
from presence import actions
from presence.keys import user_bucket
from presence.scripts import channel_online_key, connections_key, epoch_key, presence_key, user_epoch_key
from tests.support import (
    GRACE,
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


async def test_a_hostile_client_is_answered_and_changes_nothing_while_others_are_served(
    live_instances, acme, fabric, closing
):
    # On either fabric: a forged token is refused, malformed frames and a flood past the rate are
    # answered with errors on a socket that stays open, and none of it reaches the channel's
    # member on the other instance, who still gets what was acknowledged.
    a, b = live_instances(2, **fabric(**timings(RELAY_RATE_FRAMES_PER_S="20")))
    general = str(acme.channels["general"].id)
    forged = await WsClient.open(a.ws_url(acme.token("linh")[:-4] + "AAAA"))
    assert await forged.closed(timeout=WAIT) == 4401
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    assert await heard(linh, "tuan", 1) == ["online"]
    for _ in range(20):
        await linh.send_raw("not json")
    sent = [f"flood-{index}" for index in range(100)]
    for key in sent:
        await linh.send("message.send", {"idem_key": key, "channel": general, "text": "flood"})
    answered = lambda client: [  # noqa: E731
        frame for frame in client.frames if frame["type"] == "message.ack" or frame["type"] == "error"
    ]
    await linh.wait_for(lambda client: len(answered(client)) == 20 + len(sent))
    codes = {error["code"] for error in linh.of_type("error")}
    assert codes == {"invalid_frame", "rate_limited"}
    acked = {ack["id"] for ack in linh.of_type("message.ack")}
    assert acked and len(acked) < len(sent)
    await tuan.wait_for(lambda client: {created["id"] for created in client.of_type("message.created")} == acked)
    probe = await barrier(b, acme, [tuan])
    assert {created["id"] for created in tuan.of_type("message.created")} == acked
    # linh stayed connected, and online to tuan throughout.
    assert linh.close_code is None
    assert "linh" in tuan.of_type("presence.snapshot")[0]["online"] and states(tuan, "linh") == []
    await close_all(linh, tuan, probe)


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


def on_master(
    cluster: EmbeddedRedisCluster, master: EmbeddedRedis, environment: str, prefix: str, count: int
) -> list[str]:
    """`count` user ids starting with `prefix` whose presence keys live on `master`."""
    names = (f"{prefix}-{n}" for n in itertools.count())
    return list(
        itertools.islice(
            (name for name in names if cluster.master_of(presence_key(environment, name)).port == master.port), count
        )
    )


def client_of(node: EmbeddedRedis) -> redis.Redis:
    """A plain client of one node (the master of the keys a test reads)."""
    return redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1)


@pytest.mark.cluster
async def test_a_master_restarted_empty_flaps_nobody_who_stayed_and_a_leaver_is_announced_once(
    live_instances, acme, redis_cluster, closing
):
    # A single presence Redis restarting empty (tests/test_presence_operations.py,
    # `test_redis_losing_its_data_before_a_grace_check_makes_no_flap`), for one master's buckets:
    # it and its replica die, and it comes back owning its slots with no data, no replica promoted.
    # A refresh interval longer than the check's delay: b's grace check for the twin runs before
    # a's refresh has re-elected him in the emptied buckets, and only the epoch tells it so.
    grace, ttl, refresh = 600, 6000, 2000
    a, b = live_instances(2, **on_cluster(redis_cluster, **timings(grace=grace, ttl=ttl, refresh=refresh)))
    environment = str(acme.environment.id)
    general = str(acme.channels["general"].id)
    # The master of general's online set too: that set is lost with the buckets.
    victim = redis_cluster.master_of(channel_online_key(general))
    other = next(node for node in redis_cluster.masters() if node.port != victim.port)
    # Users of the victim's buckets who stay, one who stays on a and leaves b just before the
    # outage, one who leaves during it; and users of another master's buckets.
    staying = on_master(redis_cluster, victim, environment, "stay", 4)
    [twin] = on_master(redis_cluster, victim, environment, "twin", 1)
    [leaver] = on_master(redis_cluster, victim, environment, "leaver", 1)
    elsewhere = on_master(redis_cluster, other, environment, "far", 2)
    for user_id in (*staying, twin, leaver, *elsewhere):
        await add_user(acme, user_id, ("general",))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    for n, user_id in enumerate((*staying, *elsewhere)):
        await closing(connect(a if n % 2 else b, acme, user_id))
    twin_on_a = await closing(connect(a, acme, twin))
    twin_on_b = await closing(connect(b, acme, twin))
    going = await closing(connect(b, acme, leaver))
    for user_id in ("tuan", *staying, twin, leaver, *elsewhere):
        assert await heard(linh, user_id, 1) == ["online"]
    lost_epoch = user_epoch_key(environment, twin)
    kept_epoch = epoch_key(user_bucket(environment, elsewhere[0]))
    victim_client, other_client = client_of(victim), client_of(other)
    before = victim_client.get(lost_epoch), other_client.get(kept_epoch)
    assert all(before)

    # Right after a's refresh (it rewrites its connection's expiry), the twin leaves b; once
    # that close's release is done, the shard dies.
    conns = connections_key(environment, twin)
    held_on_a = twin_on_a.of_type("connection.ack")[0]["connection_id"]
    held_on_b = twin_on_b.of_type("connection.ack")[0]["connection_id"]
    score = victim_client.zscore(conns, held_on_a)
    await until(lambda: victim_client.zscore(conns, held_on_a) != score, timeout=refresh / 1000 + WAIT)
    await twin_on_b.close()
    await until(lambda: victim_client.zscore(conns, held_on_b) is None)
    victim_client.close()
    replica = await asyncio.to_thread(redis_cluster.stop_shard, victim)
    try:
        await going.close()
        await logged(b, "presence.failed", op="release")
    finally:
        await asyncio.to_thread(redis_cluster.start_shard_empty, victim, replica)
    # The victim's buckets start new epochs, the other master's keep theirs; the twin's grace
    # check sees it and asks again after a refresh instead of saying `offline`.
    await logged(b, "presence.suppressed", user=twin, reason=actions.EPOCH_CHANGED)
    victim_client = client_of(victim)
    assert victim_client.get(lost_epoch) not in (None, before[0])
    assert other_client.get(kept_epoch) == before[1]
    victim_client.close()
    other_client.close()
    # The live holders re-elect the users of the lost buckets.
    for user_id in (twin, *staying):
        holder = a if user_id == twin or user_id in staying[1::2] else b
        await logged(
            holder, "presence.suppressed", user=user_id, reason=actions.VANISHED, timeout=refresh / 1000 + WAIT
        )
    await logged(b, "presence.suppressed", user=twin, reason=actions.STILL_OPEN, timeout=refresh / 1000 + WAIT)
    # The leaver is announced once, whichever script decides.
    assert await heard(linh, leaver, 2, timeout=(ttl + grace + 2 * refresh) / 1000 + WAIT) == ["online", "offline"]
    probe = await barrier(a, acme, [linh])
    stayed = ("tuan", *staying, twin, *elsewhere)
    assert {user_id: states(linh, user_id) for user_id in stayed} == {user_id: ["online"] for user_id in stayed}
    assert states(linh, leaver) == ["online", "offline"]
    # The channel's online set, rebuilt by the refresh, lists who stayed and not the leaver.
    status, body = http("GET", f"{a.http_url}/v1/channels/{general}/presence", api_key=acme.api_key)
    assert status == 200
    assert set(stayed) <= set(body["online"])
    assert leaver not in body["online"]
    assert sorted(line["state"] for line in lines([a, b], "presence.published", user=leaver)) == ["offline", "online"]
    assert lines([a, b], "presence.published", state="offline") == lines(
        [a, b], "presence.published", user=leaver, state="offline"
    )
    # Every failure met during the outage was logged as one, none ended a task.
    assert lines([a, b], "presence.failed")
    assert all("Traceback" not in instance.log_path.read_text() for instance in (a, b))
    await close_all(linh, tuan, probe)
