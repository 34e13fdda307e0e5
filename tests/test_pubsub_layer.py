"""Relay's pub/sub layer (relay/transport/pubsub.py) against the real Redis."""

import asyncio
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis
from relay.transport import pubsub
from relay.transport.pubsub import RelayPubSubChannelLayer
from tests.support import until

T = TypeVar("T")


@pytest.fixture(scope="module")
def own_redis_url() -> Iterator[str]:
    """A Redis of these tests' own: they count commands server-wide (INFO commandstats), where a
    client of another test still winding down (a layer re-subscribing) would be counted too."""
    server = EmbeddedRedis().start()
    yield server.url
    server.close()


@pytest.fixture
def own_redis(own_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis_url, decode_responses=True)
    yield client
    client.close()


async def settled(call: Awaitable[T], guard: float = 30) -> T:
    """`call`'s outcome, its own TimeoutError included; an AssertionError if it is still waiting after `guard`."""
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait([task], timeout=guard)
    if not done:
        task.cancel()
        raise AssertionError(f"still waiting after {guard} s")
    return task.result()


def _layer(redis_url: str) -> RelayPubSubChannelLayer:
    return RelayPubSubChannelLayer(hosts=[redis_url], prefix="relay")


def _publishes(redis_client) -> int:
    return redis_client.info("commandstats").get("cmdstat_publish", {}).get("calls", 0)


def _subscribes(redis_client) -> int:
    return redis_client.info("commandstats").get("cmdstat_subscribe", {}).get("calls", 0)


async def test_consumers_share_one_inbox_subscription_and_local_sends_skip_redis(own_redis_url, own_redis):
    layer = _layer(own_redis_url)
    try:
        subscribes = _subscribes(own_redis)
        names = [await layer.new_channel() for _ in range(5)]
        assert _subscribes(own_redis) == subscribes + 1
        publishes = _publishes(own_redis)
        await layer.send(names[3], {"type": "hello", "n": 3})
        assert await layer.receive(names[3]) == {"type": "hello", "n": 3}
        assert _publishes(own_redis) == publishes
    finally:
        await layer.flush()


async def test_a_send_from_another_process_reaches_the_consumer_through_its_inbox(own_redis_url, own_redis):
    here, elsewhere = _layer(own_redis_url), _layer(own_redis_url)
    try:
        mine, other = await here.new_channel(), await here.new_channel()
        publishes = _publishes(own_redis)
        await elsewhere.send(mine, {"type": "hello", "to": "mine"})
        assert await here.receive(mine) == {"type": "hello", "to": "mine"}
        assert _publishes(own_redis) == publishes + 1
        # The inbox delivered to that channel only.
        await here.send(other, {"type": "probe"})
        assert await here.receive(other) == {"type": "probe"}
    finally:
        await here.flush()
        await elsewhere.flush()


async def test_an_idle_layer_waits_for_its_next_message_without_waking(redis_url):
    here, elsewhere = _layer(redis_url), _layer(redis_url)
    try:
        mine = await here.new_channel()
        pubsub = here._get_layer()._shards[0]._pubsub
        reads = 0
        read = pubsub.get_message

        async def counted(*args: object, **kwargs: object) -> dict | None:
            nonlocal reads
            reads += 1
            return await read(*args, **kwargs)

        # The receiver is already waiting in a read; each read it starts from now on is counted.
        pubsub.get_message = counted
        await asyncio.sleep(0.5)
        # With channels-redis's 0.1 s timeout, about five reads would have timed out by now.
        assert reads == 0
        await elsewhere.send(mine, {"type": "hello"})
        assert await here.receive(mine) == {"type": "hello"}
        # The message ended the waiting read; the receiver waits in the next one.
        assert reads == 1
    finally:
        await here.flush()
        await elsewhere.flush()


async def test_a_group_add_returns_once_redis_has_the_subscription(redis_url, redis_client):
    layer = _layer(redis_url)
    try:
        channel = await layer.new_channel()
        await layer.group_add("presence.confirmed", channel)
        # No wait: a PUBLISH from any connection now reaches the member.
        assert [count for _, count in redis_client.pubsub_numsub("relay__group__presence.confirmed")] == [1]
        await _layer(redis_url).group_send("presence.confirmed", {"type": "ping"})
        assert await layer.receive(channel) == {"type": "ping"}
    finally:
        await layer.flush()


async def test_group_send_many_is_one_round_trip_and_reaches_every_group(own_redis_url, own_redis):
    layer = _layer(own_redis_url)
    try:
        members = {}
        for group in ("g.one", "g.two", "g.three"):
            members[group] = await layer.new_channel()
            await layer.group_add(group, members[group])
        publishes = _publishes(own_redis)
        await layer.group_send_many([(group, {"type": "t", "group": group}) for group in members])
        for group, channel in members.items():
            assert await layer.receive(channel) == {"type": "t", "group": group}
        assert _publishes(own_redis) == publishes + 3
    finally:
        await layer.flush()


def _unsubscribes(redis_client) -> int:
    return redis_client.info("commandstats").get("cmdstat_unsubscribe", {}).get("calls", 0)


async def test_a_connections_groups_are_joined_with_one_subscribe_and_confirmed(own_redis_url, own_redis):
    layer = _layer(own_redis_url)
    try:
        first, second = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("g.shared", second)
        subscribes = _subscribes(own_redis)
        await layer.group_add_many(["g.a", "g.b", "g.shared"], first)
        # One SUBSCRIBE for the two groups new to the process; the shared one was already there.
        assert _subscribes(own_redis) == subscribes + 1
        numsub = dict(own_redis.pubsub_numsub("relay__group__g.a", "relay__group__g.b"))
        assert numsub == {"relay__group__g.a": 1, "relay__group__g.b": 1}
        await _layer(own_redis_url).group_send("g.b", {"type": "ping"})
        assert await layer.receive(first) == {"type": "ping"}

        unsubscribes = _unsubscribes(own_redis)
        await layer.group_discard_many(["g.a", "g.b", "g.shared"], first)
        # One UNSUBSCRIBE, for the groups nobody here is left in; the other member keeps g.shared.
        # Sent without waiting for Redis's reply, which the receiver reads: counted once Redis ran it.
        await until(lambda: _unsubscribes(own_redis) > unsubscribes)
        assert _unsubscribes(own_redis) == unsubscribes + 1
        assert dict(own_redis.pubsub_numsub("relay__group__g.a"))["relay__group__g.a"] == 0
        await _layer(own_redis_url).group_send("g.shared", {"type": "still"})
        assert await layer.receive(second) == {"type": "still"}
    finally:
        await layer.flush()


async def test_publications_are_what_a_group_send_publishes_on_the_layers_own_redis(redis_url, redis_client):
    layer = _layer(redis_url)
    try:
        channel = await layer.new_channel()
        await layer.group_add("g.scripted", channel)
        prepared = layer.publications([("g.scripted", {"type": "t", "n": 1})], redis_url)
        assert [name for name, _ in prepared] == ["relay__group__g.scripted"]
        # PUBLISHed by anyone (here: this test; in Relay: a presence script), it is that group send.
        redis_client.publish(*prepared[0])
        assert await layer.receive(channel) == {"type": "t", "n": 1}
        # Groups on another Redis: no answer, and the caller sends through the layer as usual.
        assert layer.publications([("g.scripted", {"type": "t"})], "redis://elsewhere:6379/0") is None
    finally:
        await layer.flush()


async def test_a_claimed_group_is_handed_over_once_with_its_members_and_others_are_queued(redis_url):
    layer = _layer(redis_url)
    try:
        first, second = await layer.new_channel(), await layer.new_channel()
        claimed: list[tuple[dict, tuple[str, ...]]] = []
        layer.claim_groups("presence.", lambda message, members: claimed.append((message, members)))
        for channel in (first, second):
            await layer.group_add_many(["presence.fleet", "chat.fleet"], channel)
        await _layer(redis_url).group_send_many([("presence.fleet", {"type": "p"}), ("chat.fleet", {"type": "m"})])
        assert await layer.receive(first) == {"type": "m"}
        assert await layer.receive(second) == {"type": "m"}
        # The claimed group's message came once, with both members, and was queued for neither.
        assert [(message, sorted(members)) for message, members in claimed] == [
            ({"type": "p"}, sorted([first, second]))
        ]
        assert layer.channels[first].empty() and layer.channels[second].empty()
    finally:
        await layer.flush()


async def test_the_backlog_counts_what_a_consumer_has_not_finished_handling(redis_url):
    layer = _layer(redis_url)
    try:
        channel = await layer.new_channel()
        await layer.group_add_many(["chat.fleet"], channel)
        assert layer.send_local(channel, {"type": "a"})
        await _layer(redis_url).group_send("chat.fleet", {"type": "b"})
        assert await layer.receive(channel) == {"type": "a"}
        assert await layer.receive(channel) == {"type": "b"}
        # Received is not handled: both still count until the consumer says so.
        assert layer.backlog(channel) == 2
        layer.handled(channel)
        assert layer.backlog(channel) == 1
        layer.handled(channel)
        assert layer.backlog(channel) == 0
        # A consumer that stops receiving (its receive cancelled) takes its backlog with its channel.
        assert layer.send_local(channel, {"type": "c"})
        assert await layer.receive(channel) == {"type": "c"}
        assert layer.backlog(channel) == 1
        blocked = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert channel not in layer.channels
        assert layer.backlog(channel) == 0
    finally:
        await layer.flush()


async def test_a_discarded_channel_takes_its_queue_and_backlog_and_takes_no_more(redis_url):
    layer = _layer(redis_url)
    try:
        channel = await layer.new_channel()
        kept = await layer.new_channel()
        assert layer.send_local(channel, {"type": "a"})
        assert await layer.receive(channel) == {"type": "a"}
        assert layer.send_local(channel, {"type": "b"})
        assert layer.backlog(channel) == 2
        layer.discard_channel(channel)
        assert channel not in layer._get_layer().channels
        assert layer.backlog(channel) == 0
        assert not layer.send_local(channel, {"type": "c"})
        # Only the discarded one: another channel of the process still takes its messages.
        assert layer.send_local(kept, {"type": "d"})
        assert await layer.receive(kept) == {"type": "d"}
    finally:
        await layer.flush()


@pytest.mark.parametrize("stopped", ["before the first subscribe", "after the first subscribe"])
async def test_a_group_add_during_an_outage_does_not_wait_for_a_confirmation_and_subscribes_later(monkeypatch, stopped):
    # A confirmation window no test would sit through: a group_add that waited for a SUBSCRIBE
    # Redis cannot confirm yet (never sent, or sent into a connection that then broke) would hang
    # here until the hang guard, where a connect would have passed Daphne's handshake timeout.
    monkeypatch.setattr(pubsub, "CONFIRM_SECONDS", 3600)
    server = EmbeddedRedis().start()
    layer = _layer(server.url)
    try:
        if stopped == "before the first subscribe":
            server.stop()
        channel = await settled(layer.new_channel())
        server.stop()
        await settled(layer.group_add("g.outage", channel))
        server.start()
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            # Subscribed once Redis is back, and heard.
            await until(lambda: dict(client.pubsub_numsub("relay__group__g.outage"))["relay__group__g.outage"] == 1)
        finally:
            client.close()
        await _layer(server.url).group_send("g.outage", {"type": "ping"})
        assert await asyncio.wait_for(layer.receive(channel), 60) == {"type": "ping"}
    finally:
        await layer.flush()
        server.close()


async def test_a_send_to_a_silent_redis_fails_after_the_publish_timeout_and_goes_through_once_it_answers(monkeypatch):
    # Without the timeout the send would wait until TCP gave up: past the hang guard here, and
    # with it the chat send or transition that made it.
    monkeypatch.setattr(pubsub, "PUBLISH_SECONDS", 0.5)
    server = EmbeddedRedis().start()
    layer, sender = _layer(server.url), _layer(server.url)
    try:
        channel = await layer.new_channel()
        await layer.group_add("g.silent", channel)
        await sender.group_send("g.silent", {"type": "before"})
        assert await layer.receive(channel) == {"type": "before"}
        server.pause()
        try:
            with pytest.raises(TimeoutError):
                await settled(sender.group_send("g.silent", {"type": "lost"}))
            with pytest.raises(TimeoutError):
                await settled(sender.group_send_many([("g.silent", {"type": "lost"})]))
        finally:
            server.resume()
        await sender.group_send("g.silent", {"type": "after"})
        # A timed-out PUBLISH may still be in the socket for Redis to read on resuming: its outcome
        # is unknown to the sender (presence sends such a transition again, under the same id).
        heard = [await asyncio.wait_for(layer.receive(channel), 60)]
        while heard[-1] != {"type": "after"}:
            heard.append(await asyncio.wait_for(layer.receive(channel), 60))
        assert all(message == {"type": "lost"} for message in heard[:-1])
    finally:
        await layer.flush()
        await sender.flush()
        server.close()
