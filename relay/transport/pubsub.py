"""Relay's channel layer: channels-redis's pub/sub layer, minus its per-connection and per-copy costs.

Written against channels-redis 4.3 (`requirements.txt`: >=4.3,<4.4): it subclasses the layer's
shard connection and per-loop layer and overrides their receive loop, `subscribe`, `publish`
and `_receive_message`. Guard: tests/test_transport_guards.py. Upstream: the confirmed
subscription and the timer-free receive loop are worth proposing to django/channels_redis (no
issue open yet); the process inbox follows what its core layer already does.

`RelayPubSubChannelLayer` is `RedisPubSubChannelLayer` (same settings, same groups, same wire
format) plus everything `relay.layer.RelayLayer` asks of a layer:

- One Redis subscription per PROCESS for consumers' own channels, not one per consumer. A
  consumer's channel is named `<prefix>specific.<process>!<id>`; the process subscribes once to
  its inbox `<prefix>specific.<process>!`, and `send()` to a channel of this process is put on
  its queue without touching Redis. A send from another process is published to the inbox with
  the target's name inside and routed here, so `send()` keeps working across processes.
- A subscription returns once Redis CONFIRMED it: a message published right after `group_add`
  returned must reach the new member. A SUBSCRIBE that fails (Redis away) is sent again until
  Redis takes it: redis-py re-subscribes after a reconnect only to what it sent. One that cannot
  be confirmed while Redis is away (not sent, or sent into a connection that broke and could not
  be made again) is not waited for: the connect goes on, as through any outage, instead of
  passing Daphne's handshake timeout.
- `route_group()` / `send_local()`: a process-wide handler for one group, called as its
  messages are read, which hands copies to local channels in order (relay.membership's bus).
- `claim_groups()`: a process-wide handler for every group of a prefix, called once per message
  with the group's local members, instead of one copy queued per member (presence's fan-out).
- `backlog()` / `handled()`: how many messages put on a local channel its consumer has not yet
  finished handling, so a handler that writes past the queue (a claim) knows when it may.
- `discard_channel()`: a consumer that has ended drops its channel's queue and backlog.
  channels-redis drops them only when a receive waiting on the queue is cancelled, which misses
  a consumer whose last receive had already returned a message when the socket closed: a
  message arriving as the client leaves would keep its queue for the life of the process.
- `group_send_many()`, `group_add_many()`, `group_discard_many()`: several groups in ONE round
  trip (a presence transition goes to every channel of its user; a connection joins every
  group of its channels). Publishes do not queue behind each other on the shard's lock, which
  only guards subscription changes.
- `publications()`: the (Redis channel, payload) a group send would PUBLISH, so a Lua script on
  the same Redis can publish a presence transition in the round trip that decides it.
- `lost_at()`, `back_at()`: when a pub/sub connection was last lost, and last came back. What
  is published before every process has subscribed again is lost, and so is what was still on
  its way to a subscriber at the loss: presence sends what it published around then once more
  (`PresenceService._again_if_unsteady`, `PresenceService._copy_around_loss`).
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence

import redis
from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer, RedisSingleShardConnection
from channels_redis.utils import _wrap_close

from relay.logging import Event, log_event
from relay.loops import SharedOnce
from relay.redis_clients import is_layer_redis
from relay.transport.hiredis import pack_with_hiredis

# Where a cross-process send carries its target's full name inside the published message.
TARGET_KEY = "__relay_channel__"
# How long a new subscription waits for Redis to confirm it (a round trip: well under 1 ms here).
CONFIRM_SECONDS = 1.0
# How soon a lost pub/sub connection is tried again.
RECONNECT_SECONDS = 0.05
# A publish to a Redis that went silent fails after this instead of stalling its sender (a chat
# send, a transition) until TCP gives up. Not a socket timeout: the pub/sub connection shares the
# pool's options, and its read waits for the next message however long that takes.
PUBLISH_SECONDS = 5.0

logger = logging.getLogger(__name__)


class _Shard(RedisSingleShardConnection):
    """A shard connection that routes the process inbox, confirms subscriptions, publishes lock-free."""

    def __init__(self, host: dict, channel_layer: "RelayPubSubLoopLayer") -> None:
        super().__init__(host, channel_layer)
        self._confirming: dict[str, asyncio.Future] = {}
        # Wakes the receiver as soon as there is a first subscription to read.
        self._subscribed = asyncio.Event()
        # The pub/sub connection was lost and not yet read from again.
        self._reconnecting = False
        # Channels whose SUBSCRIBE failed, and the task sending it again.
        self._unsent: set[str] = set()
        self._retrying: asyncio.Task | None = None
        # Cleared while the receiver, which has subscriptions to read, is between connections: it
        # reconnects the pub/sub connection itself, and a SUBSCRIBE sent meanwhile would make a
        # second connection attempt race its own and cut the one that won.
        self._receiving = asyncio.Event()
        self._receiving.set()
        # Redis refused a SUBSCRIBE, or the receiver could not connect again: no confirmation can
        # come until it is back, so no subscribe waits for one. Cleared when the receiver reads.
        self._away = False
        # When (monotonic s) the pub/sub connection was last found lost, and when it was last
        # whole again after that (every channel subscribed again).
        self._lost_at = float("-inf")
        self._back_at = float("-inf")

    def back_at(self) -> float:
        """When (monotonic s) the pub/sub connection last came back after a loss (-inf: never)."""
        return self._back_at

    def lost_at(self) -> float:
        """When (monotonic s) the pub/sub connection was last found lost (-inf: never)."""
        return self._lost_at

    def _lost(self, error: BaseException) -> None:
        """Note a loss, logged once per outage."""
        if not self._reconnecting:
            self._reconnecting = True
            self._lost_at = time.monotonic()
            log_event(logger, Event.LAYER_DISCONNECTED, logging.ERROR, error=f"{type(error).__name__}: {error}"[:200])

    def _whole_again(self) -> None:
        self._reconnecting = False
        self._back_at = time.monotonic()
        log_event(logger, Event.LAYER_RECONNECTED)

    def _ensure_redis(self) -> None:
        if self._redis is None:
            super()._ensure_redis()
            # Before its first connection: the subscriptions and publishes are packed in C.
            pack_with_hiredis(self._redis.connection_pool)

    async def subscribe(self, channel: str) -> None:
        """Subscribe to one channel (see `subscribe_many`)."""
        await self.subscribe_many([channel])

    async def subscribe_many(self, channels: Sequence[str]) -> None:
        """Subscribe in one SUBSCRIBE, and return once Redis has CONFIRMED every channel it can confirm now.

        (channels-redis returns on sending.) A group message published after `group_add`
        returned (say, right after the client's ack) must reach the new member; on its own pool
        connection that PUBLISH can overtake a SUBSCRIBE still in flight on the pub/sub connection.
        """
        waits: dict[str, asyncio.Future] = {}
        async with self._lock:
            new = []
            for channel in dict.fromkeys(channels):
                confirmed = self._confirming.get(channel)
                if confirmed is None and channel not in self._subscribed_to:
                    confirmed = self._confirming[channel] = asyncio.get_running_loop().create_future()
                    new.append(channel)
                if confirmed is not None:
                    waits[channel] = confirmed
            if new:
                self._ensure_redis()
                self._ensure_receiver()
                # Wanted whether or not the SUBSCRIBE gets through: one that fails (Redis away) is
                # sent again until it does, and its waiting entry resolves when Redis confirms it.
                self._subscribed_to.update(new)
                await self._send_subscribe(new)
            if self._away:
                # One whose SUBSCRIBE could not be sent is confirmed only once `_resubscribe` gets
                # it through, after Redis is back: waiting would hold the connect for nothing.
                waits = {channel: confirmed for channel, confirmed in waits.items() if channel not in self._unsent}
        if waits:
            try:
                # Unconfirmed in time, still sent and remembered: redis-py subscribes again on a
                # reconnect, and waiting longer would only stall connects while Redis is away.
                # asyncio.wait leaves the shared futures alone on a timeout or a cancellation;
                # wait_for needed a shield and a gather around them, built on every connect that
                # subscribes.
                await asyncio.wait(waits.values(), timeout=CONFIRM_SECONDS)
            finally:
                for channel, confirmed in waits.items():
                    if self._confirming.get(channel) is confirmed and confirmed.done():
                        del self._confirming[channel]

    async def _send_subscribe(self, channels: Sequence[str]) -> bool:
        """SUBSCRIBE (under the lock); on a connection error, leave them to `_resubscribe` and return False.

        redis-py subscribes again on a reconnect only to channels whose SUBSCRIBE it sent, so a
        failed one would stay unsubscribed for the life of the process.
        """
        reconnecting = self._pubsub.subscribed and not self._receiving.is_set()
        try:
            if reconnecting:
                raise redis.ConnectionError("the receiver is reconnecting")
            await self._pubsub.subscribe(*channels)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as error:
            # Refused or lost on the way, Redis is away; queued behind the receiver's reconnect, it
            # may be a blip, and the reconnect's outcome says.
            self._away = self._away or not reconnecting
            self._unsent.update(channels)
            self._lost(error)
            if self._retrying is None or self._retrying.done():
                self._retrying = asyncio.ensure_future(self._resubscribe())
            return False
        self._subscribed.set()
        return True

    async def _resubscribe(self) -> None:
        """Send the failed SUBSCRIBEs again, soon and until they get through."""
        while self._unsent:
            await asyncio.sleep(RECONNECT_SECONDS)
            async with self._lock:
                self._unsent &= self._subscribed_to  # unsubscribed meanwhile: no longer wanted
                channels = sorted(self._unsent)
                if channels and await self._send_subscribe(channels):
                    self._unsent.difference_update(channels)
        if self._reconnecting and self._pubsub is not None and self._pubsub.subscribed:
            self._whole_again()

    async def unsubscribe(self, channel: str) -> None:
        """Unsubscribe from one channel (see `unsubscribe_many`)."""
        await self.unsubscribe_many([channel])

    async def unsubscribe_many(self, channels: Sequence[str]) -> None:
        """Unsubscribe from every channel subscribed to, in one UNSUBSCRIBE."""
        async with self._lock:
            gone = [channel for channel in dict.fromkeys(channels) if channel in self._subscribed_to]
            if gone:
                # Forgotten first: with Redis away the UNSUBSCRIBE fails, and a later subscribe to
                # the same channel must send its SUBSCRIBE again rather than wait on a stale entry.
                self._subscribed_to.difference_update(gone)
                self._unsent.difference_update(gone)
                for channel in gone:
                    confirmed = self._confirming.pop(channel, None)
                    if confirmed is not None and not confirmed.done():
                        confirmed.set_result(None)
                self._ensure_redis()
                self._ensure_receiver()
                await self._pubsub.unsubscribe(*gone)

    async def _do_receiving(self) -> None:
        # channels-redis's loop, but reading subscribe confirmations instead of discarding them,
        # and waiting for the next message without a timeout: channels-redis's 0.1 s one armed and
        # cancelled a timer around every message read (and woke an idle process ten times a
        # second). Nothing needs the wake-up: the task is cancelled to stop, and a connection lost
        # ends the read with an error, as before.
        while True:
            try:
                if self._pubsub and self._pubsub.subscribed:
                    message = await self._pubsub.get_message(ignore_subscribe_messages=False, timeout=None)
                    self._receiving.set()
                    self._away = False
                    # Whole again once nothing waits to be subscribed (`_resubscribe` says so then).
                    if self._reconnecting and not self._unsent:
                        self._whole_again()
                    if message is not None and message["type"] == "subscribe":
                        self._confirm(message["channel"])
                    elif message is not None and message["type"] in ("message", "pmessage"):
                        self._receive_message(message)
                else:
                    # Not channels-redis's fixed 0.1 s nap: a first subscription's confirmation
                    # would wait for it, and with it the connect that subscribed.
                    self._subscribed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._subscribed.wait(), 0.1)
            except (asyncio.CancelledError, TimeoutError, GeneratorExit):
                raise
            except (redis.ConnectionError, redis.TimeoutError, OSError) as error:
                # Redis restarted or failed over: the next read reconnects (through the sentinels,
                # when configured) and redis-py subscribes again to every channel. Soon, since what
                # is published before that is not heard here; logged once per outage.
                if not self._receiving.is_set():
                    # Not the loss but a reconnect that failed: Redis is away, and a SUBSCRIBE sent
                    # into the lost connection is confirmed only after it returns. The connects
                    # waiting for one go on now rather than at CONFIRM_SECONDS (after a blip, the
                    # reconnect's confirmations release them).
                    self._away = True
                    for confirmed in self._confirming.values():
                        if not confirmed.done():
                            confirmed.set_result(None)
                self._receiving.clear()
                self._lost(error)
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            except Exception:
                logger.exception("Unexpected exception in receive task")
                await asyncio.sleep(1)

    async def flush(self) -> None:
        """Forget every subscription, the ones still to be sent included."""
        if self._retrying is not None:
            self._retrying.cancel()
            self._retrying = None
        self._unsent = set()
        await super().flush()

    def _confirm(self, channel: bytes | str) -> None:
        name = channel.decode() if isinstance(channel, bytes) else channel
        confirmed = self._confirming.pop(name, None)
        if confirmed is not None and not confirmed.done():
            confirmed.set_result(None)

    async def publish(self, channel: str, message: bytes) -> None:
        # The lock serialises (un)subscribes on the one pub/sub connection; a PUBLISH goes over
        # the pool, and holding the lock made every publish of the process wait for the one before.
        self._ensure_redis()
        await asyncio.wait_for(self._redis.publish(channel, message), PUBLISH_SECONDS)

    async def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """PUBLISH each (channel, payload) in one pipelined round trip."""
        self._ensure_redis()
        pipe = self._redis.pipeline(transaction=False)
        for channel, payload in messages:
            pipe.publish(channel, payload)
        await asyncio.wait_for(pipe.execute(), PUBLISH_SECONDS)

    def _receive_message(self, message: dict | None) -> None:
        if message is not None:
            name = message["channel"]
            if isinstance(name, bytes):
                name = name.decode()
            if name == self.channel_layer.inbox:
                self.channel_layer.deliver_from_inbox(message["data"])
                return
            layer = self.channel_layer
            route = layer.routes.get(name)
            if route is not None:
                route(layer.channel_layer.deserialize(message["data"]))
                return
            # channels-redis's own fan-out, with every put counted in the backlog.
            if name in layer.channels:
                layer.enqueue(name, message["data"])
                return
            members = layer.groups.get(name)
            if members:
                claim = layer.claim_of(name)
                if claim is not None:
                    claim(layer.channel_layer.deserialize(message["data"]), tuple(members))
                    return
                for channel in members:
                    layer.enqueue(channel, message["data"])


class RelayPubSubLoopLayer(RedisPubSubLoopLayer):
    """The per-event-loop half of `RelayPubSubChannelLayer`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._shards = [_Shard(shard.host, self) for shard in self._shards]
        self.inbox = f"{self.prefix}specific.{uuid.uuid4().hex}!"
        # Subscribed once per process, by the first consumer that needs it.
        self._inbox_ready = SharedOnce(lambda: self._get_shard(self.inbox).subscribe(self.inbox))
        self.routes: dict[str, Callable[[dict], None]] = {}
        self.claims: dict[str, Callable[[dict, tuple[str, ...]], None]] = {}
        self._backlog: dict[str, int] = {}

    async def new_channel(self, prefix: str = "specific.") -> str:
        """A channel of this process: a local queue, behind the inbox subscribed once per process."""
        await self._inbox_ready()
        channel = f"{self.inbox}{uuid.uuid4().hex}"
        self.channels[channel] = asyncio.Queue()
        return channel

    async def send(self, channel: str, message: dict) -> None:
        """Send to one channel: straight onto its queue when it lives here, else through Redis."""
        if self.send_local(channel, message):
            return
        inbox, bang, _ = channel.partition("!")
        if not bang:
            await super().send(channel, message)
            return
        inbox += bang
        await self._get_shard(inbox).publish(inbox, self.channel_layer.serialize({**message, TARGET_KEY: channel}))

    async def route_group(self, group: str, callback: Callable[[dict], None]) -> None:
        """Hand every message of `group` to `callback`, in this process, as it is read off Redis.

        Synchronously, in arrival order with every other message the process receives: a
        callback that puts copies on local channels (`send_local`) keeps them in the order
        they were published relative to the group messages around them.
        """
        name = self._get_group_channel_name(group)
        self.routes[name] = callback
        await self._get_shard(name).subscribe(name)

    def claim_groups(self, prefix: str, callback: Callable[[dict, tuple[str, ...]], None]) -> None:
        """Hand each message of every group named `prefix`... to `callback`, once, with the group's local members.

        Called as the message is read, like a `route_group` callback, instead of queuing one copy
        per member: the callback delivers to the members itself. Subscriptions are unchanged: a
        channel still joins such a group with `group_add`, and is a member while it is in it.
        """
        self.claims[self._get_group_channel_name(prefix)] = callback

    def claim_of(self, name: str) -> Callable[[dict, tuple[str, ...]], None] | None:
        """The claim on the group whose Redis channel is `name`, if any."""
        for prefix, callback in self.claims.items():
            if name.startswith(prefix):
                return callback
        return None

    def send_local(self, channel: str, message: dict) -> bool:
        """Put a message on a channel of this process now; False when no such channel lives here."""
        return self.enqueue(channel, self.channel_layer.serialize(message))

    def deliver_from_inbox(self, data: bytes) -> None:
        """A message another process sent to one of this process's channels: queue it for its consumer."""
        message = self.channel_layer.deserialize(data)
        # A consumer that has gone is like an unsubscribed channel: the message is dropped.
        self.enqueue(message.pop(TARGET_KEY, None), self.channel_layer.serialize(message))

    def enqueue(self, channel: str | None, data: bytes) -> bool:
        """Queue serialized `data` for the consumer of a local channel; False when it has gone."""
        queue = self.channels.get(channel)
        if queue is None:
            return False
        queue.put_nowait(data)
        self._backlog[channel] = self._backlog.get(channel, 0) + 1
        return True

    def backlog(self, channel: str) -> int:
        """Messages queued for `channel` whose handling its consumer has not finished (`handled`)."""
        return self._backlog.get(channel, 0)

    def handled(self, channel: str) -> None:
        """The consumer of `channel` has finished handling one message it received from the layer."""
        left = self._backlog.get(channel, 0) - 1
        if left > 0:
            self._backlog[channel] = left
        else:
            self._backlog.pop(channel, None)

    def discard_channel(self, channel: str) -> None:
        """Forget a local channel whose consumer has ended: its queue, what is left on it, its backlog."""
        self.channels.pop(channel, None)
        self._backlog.pop(channel, None)

    async def receive(self, channel: str) -> dict:
        """The next message of `channel`; its backlog is forgotten with the channel."""
        try:
            return await super().receive(channel)
        finally:
            # channels-redis deletes the channel when its consumer stops receiving (a cancel).
            if channel not in self.channels:
                self._backlog.pop(channel, None)

    async def group_add_many(self, groups: Sequence[str], channel: str) -> None:
        """`group_add` to every group, with one SUBSCRIBE per shard for the groups new to this process."""
        if channel not in self.channels:
            raise RuntimeError("group_add_many() takes channels that exist in this process")
        by_shard: dict[_Shard, list[str]] = {}
        for group in groups:
            name = self._get_group_channel_name(group)
            self.groups.setdefault(name, set()).add(channel)
            by_shard.setdefault(self._get_shard(name), []).append(name)
        await asyncio.gather(*(shard.subscribe_many(names) for shard, names in by_shard.items()))

    async def group_discard_many(self, groups: Sequence[str], channel: str) -> None:
        """`group_discard` from every group, with one UNSUBSCRIBE per shard for the groups left empty."""
        by_shard: dict[_Shard, list[str]] = {}
        for group in groups:
            name = self._get_group_channel_name(group)
            members = self.groups.get(name)
            if members is None or channel not in members:
                continue
            members.discard(channel)
            if not members:
                del self.groups[name]
                by_shard.setdefault(self._get_shard(name), []).append(name)
        await asyncio.gather(*(shard.unsubscribe_many(names) for shard, names in by_shard.items()))

    async def group_send_many(self, sends: Sequence[tuple[str, dict]]) -> None:
        """Send each (group, message) in one pipelined round trip per shard."""
        by_shard: dict[_Shard, list[tuple[str, bytes]]] = {}
        for group, message in sends:
            name = self._get_group_channel_name(group)
            by_shard.setdefault(self._get_shard(name), []).append((name, self.channel_layer.serialize(message)))
        await asyncio.gather(*(shard.publish_many(batch) for shard, batch in by_shard.items()))

    def publications(self, sends: Sequence[tuple[str, dict]], redis_url: str) -> list[tuple[str, bytes]] | None:
        """(Redis channel, serialized message) per (group, message); None unless they live on `redis_url`."""
        prepared = []
        for group, message in sends:
            name = self._get_group_channel_name(group)
            if not is_layer_redis(self._get_shard(name).host, redis_url):
                return None
            prepared.append((name, self.channel_layer.serialize(message)))
        return prepared

    def back_at(self) -> float:
        """When (monotonic s) a pub/sub connection of this loop last came back after a loss (-inf: never)."""
        return max(shard.back_at() for shard in self._shards)

    def lost_at(self) -> float:
        """When (monotonic s) a pub/sub connection of this loop was last found lost (-inf: never)."""
        return max(shard.lost_at() for shard in self._shards)

    def group_channel_prefix(self, prefix: str, redis_url: str) -> str | None:
        """The Redis channel name of every group named `prefix`..., minus the rest of the group's name.

        None unless the layer has one shard and it is the Redis at `redis_url`: a script there can
        then PUBLISH to any such group by name.
        """
        if len(self._shards) != 1 or not is_layer_redis(self._shards[0].host, redis_url):
            return None
        return self._get_group_channel_name(prefix)

    async def flush(self) -> None:
        """Forget everything, the inbox subscription included."""
        await super().flush()
        self._inbox_ready.reset()
        self.routes = {}
        self.claims = {}
        self._backlog = {}


class RelayPubSubChannelLayer(RedisPubSubChannelLayer):
    """`RedisPubSubChannelLayer` with one inbox subscription per process and Relay's hooks.

    The hooks are methods of the running loop's layer; they are spelled out here (channels-redis
    reaches them through `__getattr__`) so that `relay.layer.RelayLayer` can check them at start-up.
    """

    def _get_layer(self) -> RelayPubSubLoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = RelayPubSubLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)
        return layer

    async def group_send_many(self, sends: Sequence[tuple[str, dict]]) -> None:
        """Send each (group, message) in one pipelined round trip per shard."""
        await self._get_layer().group_send_many(sends)

    async def group_add_many(self, groups: Sequence[str], channel: str) -> None:
        """Add `channel` to every group, with one SUBSCRIBE per shard."""
        await self._get_layer().group_add_many(groups, channel)

    async def group_discard_many(self, groups: Sequence[str], channel: str) -> None:
        """Remove `channel` from every group, with one UNSUBSCRIBE per shard."""
        await self._get_layer().group_discard_many(groups, channel)

    def publications(self, sends: Sequence[tuple[str, dict]], redis_url: str) -> list[tuple[str, bytes]] | None:
        """(Redis channel, serialized message) per (group, message); None unless they live on `redis_url`."""
        return self._get_layer().publications(sends, redis_url)

    def back_at(self) -> float:
        """When (monotonic s) a pub/sub connection of this loop last came back after a loss (-inf: never)."""
        return self._get_layer().back_at()

    def lost_at(self) -> float:
        """When (monotonic s) a pub/sub connection of this loop was last found lost (-inf: never)."""
        return self._get_layer().lost_at()

    def group_channel_prefix(self, prefix: str, redis_url: str) -> str | None:
        """The Redis channel prefix of the groups named `prefix`..., when they all live on `redis_url`."""
        return self._get_layer().group_channel_prefix(prefix, redis_url)

    async def route_group(self, group: str, callback: Callable[[dict], None]) -> None:
        """Hand every message of `group` to `callback` as it is read (see the loop layer)."""
        await self._get_layer().route_group(group, callback)

    def claim_groups(self, prefix: str, callback: Callable[[dict, tuple[str, ...]], None]) -> None:
        """Hand each message of every group named `prefix`... to `callback` once, with its local members."""
        self._get_layer().claim_groups(prefix, callback)

    def send_local(self, channel: str, message: dict) -> bool:
        """Put a message on a channel of this process now; False when no such channel lives here."""
        return self._get_layer().send_local(channel, message)

    def backlog(self, channel: str) -> int:
        """Messages queued for `channel` whose handling its consumer has not finished."""
        return self._get_layer().backlog(channel)

    def handled(self, channel: str) -> None:
        """The consumer of `channel` has finished handling one message it received from the layer."""
        self._get_layer().handled(channel)

    def discard_channel(self, channel: str) -> None:
        """Forget a local channel whose consumer has ended (see the loop layer)."""
        self._get_layer().discard_channel(channel)
