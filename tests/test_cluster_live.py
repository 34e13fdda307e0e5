"""Two real instances whose channel layer runs on a local Redis Cluster (RELAY_REDIS_CLUSTER_NODES).

Presence is on a single Redis of its own here (RELAY_PRESENCE_REDIS_URL, the suite's embedded
one), as a deployment may keep it; tests/test_cluster_presence_live.py runs presence on the
cluster. Everything that crosses instances (messages, presence transitions, membership notices)
goes over the cluster's sharded pub/sub.
"""

import asyncio
import itertools
import time

import pytest

from chat.handlers import chat_group
from devtools.redis_cluster import EmbeddedRedisCluster
from tests.support import (
    FrameRecorder,
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
)

pytestmark = [pytest.mark.live, pytest.mark.cluster]


def on_cluster(cluster: EmbeddedRedisCluster, redis_url: str, **presence: int) -> dict[str, str]:
    """Instance settings: the layer on `cluster`, presence (`timings`) on the single Redis at `redis_url`."""
    return {
        "RELAY_REDIS_CLUSTER_NODES": cluster.nodes_setting,
        "RELAY_PRESENCE_REDIS_URL": redis_url,
        **timings(**presence),
    }


async def test_messages_presence_and_membership_changes_cross_instances_over_the_cluster(
    live_instances, acme, redis_cluster, redis_url
):
    a, b = live_instances(2, **on_cluster(redis_cluster, redis_url))
    # Ready: the database, every master of the cluster and the presence Redis answer.
    assert http("GET", f"{a.http_url}/readyz") == (
        200,
        {"status": "ok", "checks": {"database": "ok", "redis_cluster": "ok", "presence_redis": "ok"}},
    )
    await add_user(acme, "mai")
    await add_user(acme, "an")
    ops = await add_channel(acme, "ops", "public", ("mai", "an"))
    linh = await connect(a, acme, "linh")
    an = await connect(a, acme, "an")
    tuan = await connect(b, acme, "tuan")
    mai = await connect(b, acme, "mai")
    assert await heard(linh, "tuan", 1) == ["online"]
    assert "linh" in tuan.of_type("presence.snapshot")[0]["online"]
    fleet = str(acme.channels["fleet"].id)
    assert (await linh.send_and_ack({"idem_key": "k-1", "channel": fleet, "text": "from a"}))["type"] == "message.ack"
    assert (await tuan.next_of("message.created"))["text"] == "from a"

    # Added through the other instance's API: linh's connection joins ops at once, and hears
    # mai (online on b) and mai's messages.
    status, _ = http("PUT", f"{b.http_url}/v1/channels/{ops.id}/members/linh", api_key=acme.api_key)
    assert status == 201
    assert await heard(linh, "mai", 1) == ["online"]
    start = len(linh.frames)
    assert (await mai.send_and_ack({"idem_key": "k-2", "channel": str(ops.id), "text": "welcome"}))["type"] == (
        "message.ack"
    )
    assert (await linh.next_of("message.created", after=start))["text"] == "welcome"

    # Removed again through b: mai's departure from ops reaches an (still a member, on linh's
    # instance), not linh.
    status, _ = http("DELETE", f"{b.http_url}/v1/channels/{ops.id}/members/linh", api_key=acme.api_key)
    assert status == 204
    await mai.close()
    assert await heard(an, "mai", 2) == ["online", "offline"]
    probe = await barrier(a, acme, [an], channel="ops")
    assert states(linh, "mai") == ["online"]
    await close_all(linh, an, tuan, probe)


async def test_a_master_failing_over_under_load_loses_no_subscription_and_no_live_message(
    live_instances, acme, redis_cluster, redis_url
):
    # A presence TTL longer than the failover (about 2 s here): the bound a send rides out.
    a, b = live_instances(2, **on_cluster(redis_cluster, redis_url, ttl=6000, refresh=500))
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    assert await heard(linh, "tuan", 1) == ["online"]
    fleet = str(acme.channels["fleet"].id)
    # The master serving fleet's messages dies while tuan keeps sending to fleet.
    victim = redis_cluster.master_of(f"relay__group__{chat_group(fleet)}")
    replies: list[tuple[float, dict]] = []
    stop = asyncio.Event()

    async def load() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            reply = await tuan.send_and_ack({"idem_key": f"load-{n}", "channel": fleet, "text": f"load {n}"})
            replies.append((time.monotonic(), reply))
            await asyncio.sleep(0.05)

    loading = asyncio.ensure_future(load())
    try:
        await linh.next_of("message.created")
        killed = time.monotonic()
        await asyncio.to_thread(redis_cluster.kill_master, victim)
        served = time.monotonic()
        await tuan.wait_for(lambda _: sum(at > served for at, _ in replies) >= 3)
    finally:
        stop.set()
        await loading
        await asyncio.to_thread(redis_cluster.restart, victim)
    assert any(at < killed for at, _ in replies)
    # Some were acknowledged while the slot had no master.
    assert any(killed < at < served for at, _ in replies)

    # Every message acknowledged, the ones sent while the shard had no master too, reached linh
    # (connected throughout) live: each once, in seq order.
    acked = [reply["payload"] for _, reply in replies if reply["type"] == "message.ack"]
    assert len(acked) == len(replies)
    await linh.wait_for(lambda c: {f"load {n}" for n in range(len(acked))} <= texts(c))
    live = [created for created in linh.of_type("message.created") if created["channel"] == fleet]
    assert [created["seq"] for created in live] == [ack["seq"] for ack in acked]
    assert [created["text"] for created in live] == [f"load {n}" for n in range(len(acked))]

    # After the failover, without restarting anything: fleet's subscriptions from before it
    # carry messages both ways, and presence reaches the watchers connected before it.
    assert (await tuan.send_and_ack({"idem_key": "after-1", "channel": fleet, "text": "after"}))["type"] == (
        "message.ack"
    )
    await linh.wait_for(lambda c: "after" in texts(c))
    assert (await linh.send_and_ack({"idem_key": "after-2", "channel": fleet, "text": "back"}))["type"] == (
        "message.ack"
    )
    await tuan.wait_for(lambda c: "back" in texts(c))
    await add_user(acme, "kim", ("general",))
    kim = await connect(b, acme, "kim")
    assert await heard(linh, "kim", 1) == ["online"]
    assert states(linh, "tuan") == ["online"]
    # The sends that met the failover were retried, not lost.
    await logged(b, "layer.reconnected")
    assert lines([a, b], "message.fanout_failed") == []
    await close_all(linh, tuan, kim)


def texts(client: FrameRecorder) -> set[str]:
    """The texts of the messages `client` received."""
    return {created["text"] for created in client.of_type("message.created")}
