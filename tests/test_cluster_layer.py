"""Relay's channel layer on a Redis Cluster (relay/transport/cluster.py), against a real local cluster."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis, free_port
from devtools.redis_cluster import EmbeddedRedisCluster
from relay.health import ping_cluster
from relay.logging import event_fields
from relay.transport.cluster import RelayClusterChannelLayer
from tests.support import until

pytestmark = pytest.mark.cluster

GROUPS = [f"chat.g{n}" for n in range(12)]


@pytest.fixture
async def make_layer(redis_cluster: EmbeddedRedisCluster) -> AsyncIterator[Callable[..., RelayClusterChannelLayer]]:
    """Layers of separate "processes" on the test cluster (or `cluster`), flushed when the test ends."""
    made: list[RelayClusterChannelLayer] = []

    def make(cluster: EmbeddedRedisCluster = redis_cluster) -> RelayClusterChannelLayer:
        nodes = [(address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1])) for address in cluster.addresses]
        layer = RelayClusterChannelLayer(cluster_nodes=nodes, prefix="relay")
        made.append(layer)
        return layer

    yield make
    for layer in made:
        await layer.flush()


def _shard_subscribers(cluster: EmbeddedRedisCluster, channel: str) -> int:
    """The subscribers of a shard channel on the nodes that hear it now: its slot's master and replicas."""
    return sum(_subscribers_on(node, channel) for node in cluster.shard_of(channel))


def _subscribers_on(node: EmbeddedRedis, channel: str) -> int:
    client = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=5)
    try:
        return dict(client.execute_command("PUBSUB SHARDNUMSUB", channel))[channel.encode()]
    finally:
        client.close()


async def test_a_group_add_returns_once_the_groups_master_has_the_subscription(make_layer, redis_cluster):
    here, elsewhere = make_layer(), make_layer()
    channel = await here.new_channel()
    await here.group_add_many(GROUPS, channel)
    # No wait: each group's shard already counts this process among its shard channel's subscribers.
    assert all(_shard_subscribers(redis_cluster, f"relay__group__{group}") == 1 for group in GROUPS)
    # The groups spread over every master of the cluster.
    assert len({redis_cluster.master_of(f"relay__group__{group}").port for group in GROUPS}) == 3
    await elsewhere.group_send_many([(group, {"type": "t", "group": group}) for group in GROUPS])
    received = [await here.receive(channel) for _ in GROUPS]
    assert sorted(message["group"] for message in received) == sorted(GROUPS)


async def test_a_send_from_another_process_reaches_the_consumer_through_its_inbox(make_layer):
    here, elsewhere = make_layer(), make_layer()
    mine, other = await here.new_channel(), await here.new_channel()
    await elsewhere.send(mine, {"type": "hello", "to": "mine"})
    assert await here.receive(mine) == {"type": "hello", "to": "mine"}
    # A local send skips the cluster and reaches that channel only.
    await here.send(other, {"type": "probe"})
    assert await here.receive(other) == {"type": "probe"}
    assert here._get_layer().channels[mine].empty()


async def test_a_discarded_member_hears_nothing_more_and_the_other_member_still_does(make_layer, redis_cluster):
    here, elsewhere = make_layer(), make_layer()
    first, second = await here.new_channel(), await here.new_channel()
    await here.group_add_many(["g.a", "g.shared"], first)
    await here.group_add_many(["g.shared"], second)
    await here.group_discard_many(["g.a", "g.shared"], first)
    # g.a has nobody left here: its shard no longer counts this process.
    assert _shard_subscribers(redis_cluster, "relay__group__g.a") == 0
    await elsewhere.group_send_many([("g.a", {"type": "gone"}), ("g.shared", {"type": "still"})])
    assert await here.receive(second) == {"type": "still"}
    await elsewhere.send(first, {"type": "direct"})
    # The direct send came after both group messages, and is the first thing `first` hears.
    assert await here.receive(first) == {"type": "direct"}


async def test_a_routed_group_and_a_claimed_prefix_are_handed_over_as_read(make_layer):
    here, elsewhere = make_layer(), make_layer()
    first, second = await here.new_channel(), await here.new_channel()
    routed: list[dict] = []
    claimed: list[tuple[dict, tuple[str, ...]]] = []
    await here.route_group("relay.membership", routed.append)
    here.claim_groups("presence.", lambda message, members: claimed.append((message, members)))
    for channel in (first, second):
        await here.group_add_many(["presence.fleet", "chat.fleet"], channel)
    await elsewhere.group_send_many(
        [("relay.membership", {"type": "r"}), ("presence.fleet", {"type": "p"}), ("chat.fleet", {"type": "m"})]
    )
    assert await here.receive(first) == {"type": "m"}
    assert await here.receive(second) == {"type": "m"}
    await until(lambda: routed and claimed)
    assert routed == [{"type": "r"}]
    assert [(message, sorted(members)) for message, members in claimed] == [({"type": "p"}, sorted([first, second]))]


async def test_scripts_cannot_publish_on_a_cluster_so_presence_publishes_itself(make_layer, redis_url):
    layer = make_layer()
    await layer.new_channel()
    assert layer.publications([("presence.fleet", {"type": "t"})], redis_url) is None
    assert layer.group_channel_prefix("presence.", redis_url) is None


async def test_a_slot_moving_to_another_master_takes_its_subscriptions_along(make_layer, redis_cluster):
    here, elsewhere = make_layer(), make_layer()
    channel = await here.new_channel()
    await here.group_add_many(["g.moving", "g.staying"], channel)
    moving = "relay__group__g.moving"
    await elsewhere.group_send("g.moving", {"type": "before"})
    assert await here.receive(channel) == {"type": "before"}
    source = redis_cluster.shard_of(moving)
    target = next(master for master in redis_cluster.masters() if master.port != source[0].port)
    await asyncio.to_thread(redis_cluster.move_slot_of, moving, target)
    # The old shard dropped the subscription when it lost the slot; the layer makes it again
    # on the new one, by itself.
    await until(lambda: _shard_subscribers(redis_cluster, moving) == 1)
    await elsewhere.group_send_many([("g.moving", {"type": "moved"}), ("g.staying", {"type": "stayed"})])
    received = [await asyncio.wait_for(here.receive(channel), 10) for _ in range(2)]
    assert sorted(message["type"] for message in received) == ["moved", "stayed"]
    # Still subscribed once: the old shard's nodes count nobody.
    assert [_subscribers_on(node, moving) for node in source] == [0, 0]


async def test_a_graceful_failover_leaves_every_subscription_on_the_replica_that_takes_over(
    make_layer, redis_cluster, caplog
):
    caplog.set_level(logging.INFO, logger="relay.transport.cluster")
    here, elsewhere = make_layer(), make_layer()
    channel = await here.new_channel()
    await here.group_add_many(GROUPS, channel)
    old = redis_cluster.master_of(f"relay__group__{GROUPS[0]}")
    on_old = [f"relay__group__{group}" for group in GROUPS if redis_cluster.master_of(f"relay__group__{group}") is old]
    # The subscriptions are on the replica, which becomes the master: nothing to move.
    new = await asyncio.to_thread(redis_cluster.fail_over, old)
    assert all(_subscribers_on(new, name) == 1 for name in on_old)
    assert all(_subscribers_on(old, name) == 0 for name in on_old)
    await elsewhere.group_send_many([(group, {"type": "t", "group": group}) for group in GROUPS])
    received = [await asyncio.wait_for(here.receive(channel), 10) for _ in GROUPS]
    assert sorted(message["group"] for message in received) == sorted(GROUPS)
    # Heard once each: what follows them is the next thing heard.
    await elsewhere.send(channel, {"type": "direct"})
    assert await asyncio.wait_for(here.receive(channel), 10) == {"type": "direct"}
    assert not _logged(caplog, "layer.disconnected")


async def test_a_node_gone_silent_under_subscriptions_is_noticed_and_they_move_to_its_master(
    make_layer, redis_cluster, caplog
):
    caplog.set_level(logging.INFO, logger="relay.transport.cluster")
    here, elsewhere = make_layer(), make_layer()
    channel = await here.new_channel()
    await here.group_add_many(GROUPS, channel)
    # Frozen, not killed: its sockets stay open and say nothing, as a host that vanished.
    master = redis_cluster.master_of(f"relay__group__{GROUPS[0]}")
    on_it = [
        f"relay__group__{group}" for group in GROUPS if redis_cluster.master_of(f"relay__group__{group}") is master
    ]
    # They are on the master's replica.
    replica = redis_cluster.shard_of(on_it[0])[1]
    assert all(_subscribers_on(replica, name) == 1 for name in on_it)
    silent = await asyncio.to_thread(redis_cluster.freeze_replica, master)
    assert silent.port == replica.port
    try:
        await until(lambda: _logged(caplog, "layer.reconnected"))
        assert "PINGs unanswered" in _logged(caplog, "layer.disconnected")[0]["error"]
        assert all(_subscribers_on(master, name) == 1 for name in on_it)
        await elsewhere.group_send_many([(group, {"type": "t", "group": group}) for group in GROUPS])
        received = [await asyncio.wait_for(here.receive(channel), 10) for _ in GROUPS]
        assert sorted(message["group"] for message in received) == sorted(GROUPS)
    finally:
        await asyncio.to_thread(redis_cluster.thaw, silent)


async def test_sends_while_a_master_fails_over_wait_for_its_successor_and_are_heard_once_in_order(
    make_layer, redis_cluster, caplog
):
    caplog.set_level(logging.INFO, logger="relay.transport.cluster")
    here, elsewhere = make_layer(), make_layer()
    channel = await here.new_channel()
    await here.group_add_many(GROUPS, channel)
    # The sender knows the slot map from before the failover.
    await elsewhere.group_send(GROUPS[0], {"type": "before"})
    assert await here.receive(channel) == {"type": "before"}
    victim = redis_cluster.master_of(f"relay__group__{GROUPS[0]}")
    on_victim = [
        f"relay__group__{group}" for group in GROUPS if redis_cluster.master_of(f"relay__group__{group}") is victim
    ]
    successor = redis_cluster.shard_of(f"relay__group__{GROUPS[0]}")[1]
    killing = asyncio.ensure_future(asyncio.to_thread(redis_cluster.kill_master, victim))
    sent = 0
    try:
        await until(lambda: not victim.running)
        # One after another, while the slot has no master and after: each send returns once sent.
        while not killing.done() or sent < 3:
            await elsewhere.group_send(GROUPS[0], {"type": "t", "n": sent})
            sent += 1
        await killing
        # Every group subscribed before the failover hears what is sent after it, without
        # having been subscribed again: its subscription was on the replica that took over.
        await elsewhere.group_send_many([(group, {"type": "after", "group": group}) for group in GROUPS])
        received = [await asyncio.wait_for(here.receive(channel), 10) for _ in range(sent + len(GROUPS))]
        assert [message["n"] for message in received if message["type"] == "t"] == list(range(sent))
        assert sorted(message["group"] for message in received if message["type"] == "after") == sorted(GROUPS)
        await elsewhere.send(channel, {"type": "direct"})
        assert await asyncio.wait_for(here.receive(channel), 10) == {"type": "direct"}
        assert all(_subscribers_on(successor, name) == 1 for name in on_victim)
        # The sender met the dead master and waited for the new one.
        assert "Connection" in _logged(caplog, "layer.disconnected")[0]["error"]
        assert _logged(caplog, "layer.reconnected")
    finally:
        await killing
        await asyncio.to_thread(redis_cluster.restart, victim)


def _logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict]:
    return [event_fields(record) for record in caplog.records if record.getMessage() == event]


async def test_groups_joined_while_the_cluster_is_down_are_subscribed_once_it_is_up(make_layer, caplog):
    caplog.set_level(logging.INFO, logger="relay.transport.cluster")
    cluster = EmbeddedRedisCluster()
    try:
        here = make_layer(cluster)
        # Nothing answers yet: the join returns (unconfirmed) instead of stalling the connect.
        channel = await here.new_channel()
        await here.group_add_many(GROUPS, channel)
        assert _logged(caplog, "layer.disconnected")
        assert not _logged(caplog, "layer.reconnected")
        assert here.back_at() == float("-inf")
        await asyncio.to_thread(cluster.start)
        await until(lambda: _logged(caplog, "layer.reconnected"))
        # Presence sends what it publishes just now once more (PresenceService._again_if_unsteady).
        assert time.monotonic() - here.back_at() < 10
        await make_layer(cluster).group_send_many([(group, {"type": "t", "group": group}) for group in GROUPS])
        received = [await asyncio.wait_for(here.receive(channel), 10) for _ in GROUPS]
        assert sorted(message["group"] for message in received) == sorted(GROUPS)
        await make_layer(cluster).send(channel, {"type": "direct"})
        assert await asyncio.wait_for(here.receive(channel), 10) == {"type": "direct"}
    finally:
        cluster.close()


def test_readiness_names_a_cluster_that_does_not_answer(redis_cluster):
    nodes = [(address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1])) for address in redis_cluster.addresses]
    assert ping_cluster(nodes) == "ok"
    assert ping_cluster([("127.0.0.1", free_port())]) == "RedisClusterException"


async def test_a_handler_that_raises_does_not_stop_its_masters_reader(make_layer, caplog):
    here, elsewhere = make_layer(), make_layer()
    channel = await here.new_channel()
    # The same hash tag: both groups live in one slot, read by one connection.
    await here.route_group("{same-slot}broken", lambda message: 1 / 0)
    await here.group_add_many(["{same-slot}after"], channel)
    await elsewhere.group_send("{same-slot}broken", {"type": "boom"})
    await until(lambda: any(record.getMessage() == "Unexpected exception in receive task" for record in caplog.records))
    await elsewhere.group_send("{same-slot}after", {"type": "still read"})
    assert await asyncio.wait_for(here.receive(channel), 10) == {"type": "still read"}


async def test_a_cluster_with_a_password_takes_it_and_a_layer_without_it_gets_nothing(caplog):
    caplog.set_level(logging.INFO, logger="relay.transport.cluster")
    secret = "cluster-secret-not-for-logs"
    cluster = EmbeddedRedisCluster(password=secret)
    layers: list[RelayClusterChannelLayer] = []
    try:
        await asyncio.to_thread(cluster.start)
        nodes = [(address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1])) for address in cluster.addresses]
        here, elsewhere, stranger = (
            RelayClusterChannelLayer(cluster_nodes=nodes, cluster_options=options, prefix="relay")
            for options in ({"password": secret}, {"password": secret}, {})
        )
        layers += [here, elsewhere, stranger]
        # Bounded: a step that never returns fails here, naming itself, instead of holding the suite.
        channel = await asyncio.wait_for(here.new_channel(), 30)
        await asyncio.wait_for(here.group_add_many(GROUPS, channel), 30)
        sends = [(group, {"type": "t", "group": group}) for group in GROUPS]
        await asyncio.wait_for(elsewhere.group_send_many(sends), 30)
        received = [await asyncio.wait_for(here.receive(channel), 10) for _ in GROUPS]
        assert sorted(message["group"] for message in received) == sorted(GROUPS)
        # Without the password: refused, said once in the log, the password nowhere in it.
        with pytest.raises(redis.RedisClusterException, match="Authentication required"):
            await asyncio.wait_for(stranger.group_send(GROUPS[0], {"type": "intruder"}), 30)
        await asyncio.wait_for(stranger.new_channel(), 30)
        await until(lambda: _logged(caplog, "layer.disconnected"))
        assert all(secret not in record.getMessage() + str(event_fields(record)) for record in caplog.records)
        assert ping_cluster(nodes, password=secret) == "ok"
        assert ping_cluster(nodes) != "ok"
    finally:
        for layer in layers:
            await asyncio.wait_for(layer.flush(), 30)
        cluster.close()
