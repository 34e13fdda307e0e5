"""Relay's channel layer on a Redis Cluster: groups and process inboxes over sharded pub/sub.

Written against redis-py 6.4 (requirements.txt: >=5,<7) and channels-redis 4.3. redis-py's
asyncio `RedisCluster` publishes (SPUBLISH is routed by its channel's slot, MOVED and failovers
handled by the client), but it has no pub/sub before redis-py 8.0 (redis/redis-py#2219, closed
by redis/redis-py#3736), outside the range the rest of Relay is written for (redis-py 8 also
makes RESP3 the default). coredis has sharded pub/sub, but would be a second Redis client beside
redis-py for this one feature. So the SSUBSCRIBE side is here: one connection per node it
subscribes on, opened from the `ClusterNode`s that `RedisCluster` maps a channel's slot to, read
as a plain RESP stream. It reaches into redis-py for three things, all guarded by
tests/test_transport_guards.py: `nodes_manager.initialize()` to re-read the slot map after a
failover or a slot migration, `nodes_manager.slots_cache` for the nodes of a slot (its master,
then its replicas), and a node's `connection_class`/`connection_kwargs` to open the subscribing
connections as the client opens its own. The layer is
`relay.transport.pubsub`'s with its one shard replaced by `_ClusterShard` (same groups, wire
format, process inbox and hooks); channels-redis itself has no cluster support
(django/channels_redis#420).

What each shard holds: the shard channels whose names hash to its slots, the group channels
(`relay__group__<group>`) and process inboxes (`relay__specific.<process>!`) spread across all
of them. A subscription is made on a replica of the slot's master (Redis 7 delivers a shard
channel's messages to every node of its shard, and a replica keeps its subscribers when it is
promoted), on the master when the slot map lists no replica, and returns once that node
confirmed it, as on one Redis.

Failover and migration: a master's failover leaves the subscriptions where they are. A send that
meets a slot without a master is tried again until the new master takes it (`_ClusterShard`). A
subscribing connection that breaks or stops answering PINGs (a host that vanished), a MOVED
answer to an SSUBSCRIBE, or an SUNSUBSCRIBE the server sent on its own (the slot moved to another
shard, a master became a replica) re-reads the slot map and subscribes every channel this
process wants that no node of its slot's shard holds, retrying until every one is confirmed.
What the master published while a channel was being subscribed again is not heard there. The
slot map is re-read on a client of its own: redis-py replaces every node's connections when it
re-reads one, which would cut the publishes under way.

Presence cannot publish from its scripts here (`publications()` and `group_channel_prefix()`
answer None): a script runs on one master, and the groups it would publish to live on others.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import redis
from channels_redis.utils import _wrap_close
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, AuthorizationError, ClusterDownError, MovedError, TryAgainError

from relay.logging import Event, log_event
from relay.redis_clients import CONNECT_SECONDS
from relay.transport.pubsub import (
    CONFIRM_SECONDS,
    PUBLISH_SECONDS,
    RECONNECT_SECONDS,
    RelayPubSubChannelLayer,
    RelayPubSubLoopLayer,
    _Shard,
)

# Reading the slot map from a node that went silent must not stall a resync.
TOPOLOGY_SECONDS = 1.0
# How long a send whose slot has no master (a failover under way, the cluster down) is tried
# again, every RECONNECT_SECONDS, before it fails: the layer's `publish_retry_seconds`, which
# Relay's settings make the presence TTL less one refresh interval (relay/settings.py).
PUBLISH_RETRY_SECONDS = 30.0
# How often each subscribing connection is PINGed, and how many PINGs may go unanswered before
# it is taken for dead: a master whose host vanished (no reset, no unsubscribe) would otherwise
# leave it waiting for ever, deaf to the failover.
PING_SECONDS = 1.0
PINGS_UNANSWERED = 3

logger = logging.getLogger(__name__)

# Errors after which a send is tried again on a slot map read again: the slot has no master, or
# moved. Not a refused password or command, which no failover mends.
_SEND_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    TryAgainError,
    MovedError,
    AskError,
    redis.RedisClusterException,
    OSError,
)
_SEND_FATAL = (redis.AuthenticationError, AuthorizationError)


def _retried(error: BaseException) -> bool:
    """Whether a send that failed with `error` is tried again (redis-py wraps a refusal met reading the slot map)."""
    if closed_under_a_write(error):
        return True
    return isinstance(error, _SEND_ERRORS) and not isinstance(error.__cause__ or error, _SEND_FATAL)


# Errors after which the slot map is read again and every subscription placed again.
_TOPOLOGY_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ResponseError,
    redis.RedisClusterException,
    OSError,
)


# Where redis-py's own code is: an AttributeError raised there is its, not Relay's.
_REDIS_PY = str(Path(redis.__file__).parent)


def closed_under_a_write(error: BaseException) -> bool:
    """Whether `error` is redis-py's asyncio connection written on after another task disconnected it.

    redis-py 6.4 clears a connection's writer on `disconnect()`, and a task already past its
    connected check then writes on None: AttributeError instead of ConnectionError
    (redis/redis-py#3546, fixed upstream by redis/redis-py#4288, after 6.4). `RedisCluster`
    makes it common: a command that meets a dead node disconnects every node's connections,
    those other commands are using too. The same failure as a ConnectionError. Guarded by
    tests/test_transport_guards.py.
    """
    if not isinstance(error, AttributeError) or error.__traceback__ is None:
        return False
    trace = error.__traceback__
    while trace.tb_next is not None:
        trace = trace.tb_next
    return trace.tb_frame.f_code.co_filename.startswith(_REDIS_PY)


def cluster_client(nodes: Sequence[tuple[str, int]], timeout: float = PUBLISH_SECONDS, **options: Any) -> RedisCluster:
    """An asyncio `RedisCluster` that starts from `nodes` (`host`, `port`); a command waits `timeout` at most.

    `options` are redis-py's own (`username`, `password`, `ssl`), for every node.
    """
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        socket_connect_timeout=CONNECT_SECONDS,
        socket_timeout=timeout,
        **options,
    )


def queue_script(pipe: Any, sha: str, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Queue an EVALSHA of a loaded script on `pipe`, a single Redis's pipeline or a cluster's.

    redis-py 6.4's `ClusterPipeline` refuses its own `evalsha` method (a blanket list,
    `PIPELINE_BLOCKED_COMMANDS`: redis/redis-py#2914, lifted by redis/redis-py#4206 in a later
    release), although it routes an EVALSHA by its KEYS like any keyed command. So the command
    goes through `execute_command`, which the list does not cover; each script's keys are of one
    slot, and the caller loads the script on every master first (or answers NOSCRIPT by loading it).
    Guarded by tests/test_transport_guards.py.
    """
    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)


class _Outage:
    """One process's layer outage, whether its subscriptions or its sends met it: logged once each way."""

    def __init__(self) -> None:
        self._causes: set[str] = set()
        # When (monotonic s) the subscriptions were last found lost, and last came back after
        # that (-inf: never).
        self.lost_at = float("-inf")
        self.subscribed_at = float("-inf")

    def begin(self, cause: str, error: BaseException) -> None:
        if not self._causes:
            log_event(logger, Event.LAYER_DISCONNECTED, logging.ERROR, error=f"{type(error).__name__}: {error}"[:200])
        if cause == "subscribe" and cause not in self._causes:
            self.lost_at = time.monotonic()
        self._causes.add(cause)

    def end(self, cause: str) -> None:
        if cause in self._causes:
            self._causes.discard(cause)
            if cause == "subscribe":
                self.subscribed_at = time.monotonic()
            if not self._causes:
                log_event(logger, Event.LAYER_RECONNECTED)


class _Link:
    """One subscribing connection to one node, and the shard channels it confirmed."""

    def __init__(self, node: ClusterNode, connection: Connection) -> None:
        self.node = node
        self.connection = connection
        self.channels: set[str] = set()
        # Unsubscribed by this process and not yet confirmed: not a slot that moved away.
        self.leaving: set[str] = set()
        # PINGs sent since the connection last said anything.
        self.unanswered = 0
        self.reader: asyncio.Task | None = None


class ShardedSubscriptions:
    """The shard channels one process subscribes to on a cluster, kept subscribed across its changes."""

    def __init__(
        self, cluster: RedisCluster, deliver: Callable[[str, bytes], None], outage: _Outage | None = None
    ) -> None:
        self.cluster = cluster
        self.deliver = deliver
        self._outage = outage or _Outage()
        self.wanted: set[str] = set()
        self._links: dict[str, _Link] = {}
        self._confirming: dict[str, asyncio.Future] = {}
        # Serialises what is sent on the links, so a SUBSCRIBE and an UNSUBSCRIBE keep their order.
        self._lock = asyncio.Lock()
        self._resync: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._resync_again = False
        self._closed = False
        # Disconnects of dropped links under way (held so they are not collected mid-way).
        self._closing: set[asyncio.Task] = set()

    async def subscribe(self, channels: Iterable[str]) -> None:
        """SSUBSCRIBE to every channel on its home node; return once each is confirmed (or after CONFIRM_SECONDS).

        One unconfirmed in time stays wanted: the resync that a failure started subscribes it
        when its master answers.
        """
        names = list(dict.fromkeys(channels))
        waits = []
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._watch_links())
        async with self._lock:
            new = [name for name in names if name not in self.wanted]
            self.wanted.update(new)
            for name in names:
                if not self._held(name):
                    waits.append(self._future(name))
            if new:
                try:
                    await self._place(new)
                except _TOPOLOGY_ERRORS as error:
                    self._lost(error)
        if waits:
            await asyncio.wait(waits, timeout=CONFIRM_SECONDS)

    async def unsubscribe(self, channels: Iterable[str]) -> None:
        """SUNSUBSCRIBE from every channel subscribed to."""
        async with self._lock:
            gone = set(channels) & self.wanted
            self.wanted -= gone
            # Nobody waits on a channel given up before its master confirmed it.
            for name in gone:
                future = self._confirming.pop(name, None)
                if future is not None and not future.done():
                    future.set_result(None)
            for link in list(self._links.values()):
                mine = sorted(gone & link.channels)
                if mine:
                    await self._unsubscribe_on(link, mine)

    async def close(self) -> None:
        """Stop every reader and close every connection."""
        self._closed = True
        tasks = [link.reader for link in self._links.values() if link.reader is not None]
        tasks += [task for task in (self._resync, self._watch) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for link in self._links.values():
            await link.connection.disconnect()
        self._links = {}
        self.wanted = set()

    def _held(self, name: str) -> bool:
        return any(name in link.channels for link in self._links.values())

    def _future(self, name: str) -> asyncio.Future:
        future = self._confirming.get(name)
        if future is None or future.done():
            future = self._confirming[name] = asyncio.get_running_loop().create_future()
        return future

    def _shard(self, name: str) -> list[ClusterNode]:
        """The nodes that hear what is published to shard channel `name`: its slot's master, then its replicas."""
        nodes = self.cluster.nodes_manager.slots_cache.get(self.cluster.keyslot(name))
        if not nodes:
            raise redis.exceptions.SlotNotCoveredError(f"no node serves the slot of {name}")
        return nodes

    def _home(self, name: str) -> ClusterNode:
        """Where a new subscription to `name` goes: a replica of its slot's master, or the master if it has none.

        A replica hears every SPUBLISH its master takes, and keeps its subscribers when it is
        promoted: a master's failover then leaves the subscription where it was, and a send that
        waited for the new master reaches it.
        """
        master, *replicas = self._shard(name)
        return replicas[self.cluster.keyslot(name) % len(replicas)] if replicas else master

    async def _place(self, names: Iterable[str]) -> None:
        """SSUBSCRIBE each channel on its home node: one command per slot, pipelined per node."""
        await self.cluster.initialize()
        by_node: dict[str, dict[int, list[str]]] = {}
        nodes: dict[str, ClusterNode] = {}
        for name in names:
            node = self._home(name)
            nodes[node.name] = node
            by_node.setdefault(node.name, {}).setdefault(self.cluster.keyslot(name), []).append(name)
        for node_name, by_slot in by_node.items():
            link = await self._link(nodes[node_name])
            await self._send_many(link, [("SSUBSCRIBE", *channels) for channels in by_slot.values()])

    async def _link(self, node: ClusterNode) -> _Link:
        link = self._links.get(node.name)
        if link is None:
            connection = node.connection_class(**node.connection_kwargs)
            # The handshake with the client's timeout (a silent master must not hold the lock for
            # ever), then none: a subscribed connection waits for messages.
            await connection.connect()
            connection.socket_timeout = None
            link = self._links[node.name] = _Link(node, connection)
            link.reader = asyncio.ensure_future(self._read(link))
        return link

    async def _send(self, link: _Link, command: str, channels: Sequence[str]) -> None:
        by_slot: dict[int, list[str]] = {}
        for name in channels:
            by_slot.setdefault(self.cluster.keyslot(name), []).append(name)
        await self._send_many(link, [(command, *names) for names in by_slot.values()])

    async def _send_many(self, link: _Link, commands: list[tuple]) -> None:
        try:
            await link.connection.send_packed_command(link.connection.pack_commands(commands), False)
        except _TOPOLOGY_ERRORS:
            self._drop(link)
            raise

    async def _read(self, link: _Link) -> None:
        """Read one node's pushes: messages, confirmations, and the unsubscribes it decided itself."""
        while True:
            try:
                reply = await link.connection.read_response(timeout=None)
            except asyncio.CancelledError:
                raise
            except redis.ResponseError as error:
                # MOVED (the slot left this master between the map and the SSUBSCRIBE), CLUSTERDOWN.
                self._lost(error)
                continue
            except _TOPOLOGY_ERRORS as error:
                self._drop(link)
                self._lost(error)
                return
            link.unanswered = 0
            if not isinstance(reply, list) or len(reply) < 3:
                continue  # a PING's answer
            kind, name = reply[0], reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
            if kind == b"smessage":
                try:
                    self.deliver(name, reply[2])
                except Exception:
                    # One bad message or handler must not end the reading of every channel here.
                    logger.exception("Unexpected exception in receive task")
            elif kind == b"ssubscribe":
                if name in self.wanted:
                    link.channels.add(name)
                future = self._confirming.pop(name, None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif kind == b"sunsubscribe":
                link.channels.discard(name)
                if name in link.leaving:
                    link.leaving.discard(name)
                elif name in self.wanted:
                    # Not asked for: the slot moved to another master, or this one became a replica.
                    self._lost(None)

    def _drop(self, link: _Link) -> None:
        """Forget a broken link: its channels are subscribed again by the resync."""
        if self._links.get(link.node.name) is link:
            del self._links[link.node.name]
        if link.reader is not None and link.reader is not asyncio.current_task():
            link.reader.cancel()
        closing = asyncio.ensure_future(link.connection.disconnect(nowait=True))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _lost(self, error: BaseException | None) -> None:
        """Something changed under a subscription: resync (once at a time; again if asked meanwhile)."""
        if self._closed:
            return
        if error is not None:
            self._outage.begin("subscribe", error)
        if self._resync is not None and not self._resync.done():
            self._resync_again = True
            return
        self._resync = asyncio.ensure_future(self._run_resync())

    async def _watch_links(self) -> None:
        """PING every link each PING_SECONDS; one that leaves PINGS_UNANSWERED unanswered is dropped."""
        while True:
            await asyncio.sleep(PING_SECONDS)
            for link in list(self._links.values()):
                if link.unanswered >= PINGS_UNANSWERED:
                    self._drop(link)
                    self._lost(redis.TimeoutError(f"{link.node.name} left {link.unanswered} PINGs unanswered"))
                    continue
                link.unanswered += 1
                try:
                    await link.connection.send_packed_command(link.connection.pack_command("PING"), False)
                except _TOPOLOGY_ERRORS as error:
                    self._drop(link)
                    self._lost(error)

    async def _run_resync(self) -> None:
        while True:
            self._resync_again = False
            try:
                if await self._resubscribe():
                    if not self._resync_again:
                        break
                    continue
            except _TOPOLOGY_ERRORS:
                pass
            await asyncio.sleep(RECONNECT_SECONDS)
        self._outage.end("subscribe")

    async def _resubscribe(self) -> bool:
        """Re-read the slot map and subscribe what no node of its slot's shard holds; True once all are confirmed.

        A subscription stays where it is while that node is still its slot's master or one of
        its replicas: moving it would hear the channel twice, or not at all, in between.
        """
        await self.cluster.nodes_manager.initialize()
        async with self._lock:
            misplaced = []
            stale: dict[str, tuple[_Link, list[str]]] = {}
            for name in self.wanted:
                shard = {node.name for node in self._shard(name)}
                held = False
                for link in self._links.values():
                    if name in link.channels:
                        if link.node.name in shard:
                            held = True
                        else:
                            stale.setdefault(link.node.name, (link, []))[1].append(name)
                if not held:
                    misplaced.append(name)
            # A node the slot map no longer lists (failed, removed) is closed, which ends its
            # subscriptions; a node whose shard lost some slots is told to drop theirs, so that no
            # channel is heard twice.
            listed = {node.name for node in self.cluster.get_nodes()}
            for link in list(self._links.values()):
                if link.node.name not in listed:
                    self._drop(link)
            for link, names in stale.values():
                if self._links.get(link.node.name) is link:
                    await self._unsubscribe_on(link, names)
            waits = [self._future(name) for name in misplaced]
            if misplaced:
                await self._place(misplaced)
        if waits:
            await asyncio.wait(waits, timeout=CONFIRM_SECONDS)
        return all(self._held(name) for name in list(self.wanted))

    async def _unsubscribe_on(self, link: _Link, names: Sequence[str]) -> None:
        link.channels.difference_update(names)
        link.leaving.update(names)
        try:
            await self._send(link, "SUNSUBSCRIBE", names)
        except _TOPOLOGY_ERRORS as error:
            self._lost(error)


class _ClusterShard(_Shard):
    """The layer's one "shard": the whole cluster, published to with SPUBLISH and read with SSUBSCRIBE.

    Only the routing of what is read (`_receive_message`: the inbox, routes, claims, members)
    is the single-Redis shard's; every command goes through `RedisCluster` and
    `ShardedSubscriptions` instead.

    A send that meets a slot without a master is tried again, on a slot map read again, every
    RECONNECT_SECONDS until the slot has one (or `retry_seconds` have passed: then it fails as on
    one Redis). Sends that come meanwhile wait behind it, so one process's sends keep their
    order. The publishing client never retries by itself: redis-py's pipeline would send again
    every command whose answer is 0 (an SPUBLISH no client heard on that node) with the failed ones.
    """

    def __init__(
        self,
        nodes: Sequence[tuple[str, int]],
        options: dict[str, Any],
        channel_layer: "RelayClusterLoopLayer",
        retry_seconds: float = PUBLISH_RETRY_SECONDS,
    ) -> None:
        super().__init__({"cluster": list(nodes)}, channel_layer)
        self._nodes = list(nodes)
        self._options = options
        self._retry_seconds = retry_seconds
        self._cluster: RedisCluster | None = None
        self._sharded: ShardedSubscriptions | None = None
        self._outage = _Outage()
        # Sends being retried or waiting behind one (in order), and sends in flight outside them:
        # the slot map is read again only once none is (reading it cuts every connection).
        self._in_order = asyncio.Lock()
        self._queued = 0
        self._flying = 0
        self._landed = asyncio.Event()
        self._landed.set()

    def back_at(self) -> float:
        """When (monotonic s) the sharded subscriptions last came back after an outage (-inf: never)."""
        return self._outage.subscribed_at

    def lost_at(self) -> float:
        """When (monotonic s) the sharded subscriptions were last found lost (-inf: never)."""
        return self._outage.lost_at

    def _subscriptions(self) -> ShardedSubscriptions:
        if self._sharded is None:
            self._cluster = cluster_client(self._nodes, retry=Retry(NoBackoff(), 0), **self._options)
            self._sharded = ShardedSubscriptions(
                cluster_client(self._nodes, TOPOLOGY_SECONDS, **self._options), self._deliver, self._outage
            )
        return self._sharded

    def _deliver(self, channel: str, data: bytes) -> None:
        self._receive_message({"channel": channel, "data": data})

    async def subscribe_many(self, channels: Sequence[str]) -> None:
        """SSUBSCRIBE, returning once every channel is confirmed by the node it is subscribed on."""
        await self._subscriptions().subscribe(channels)

    async def unsubscribe_many(self, channels: Sequence[str]) -> None:
        """SUNSUBSCRIBE from every channel."""
        await self._subscriptions().unsubscribe(channels)

    async def publish(self, channel: str, message: bytes) -> None:
        await self.publish_many([(channel, message)])

    async def publish_many(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """SPUBLISH each (channel, payload): one pipelined round trip per master, retried while a slot has no master."""
        self._subscriptions()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_seconds
        left: list[tuple[str, bytes]] = list(messages)
        error: BaseException | None = None
        if not self._queued:
            self._flying += 1
            self._landed.clear()
            try:
                left, error = await self._attempt(left)
            finally:
                self._flying -= 1
                if not self._flying:
                    self._landed.set()
            if not left:
                # Also the end of an outage whose retried send was given up by its caller.
                self._outage.end("publish")
                return
        self._queued += 1
        try:
            async with self._in_order:
                while True:
                    if error is not None:
                        if loop.time() >= deadline:
                            raise error
                        self._outage.begin("publish", error)
                        await asyncio.sleep(RECONNECT_SECONDS)
                        await self._landed.wait()
                        # The slot map is read again before the next command.
                        await self._cluster.aclose()
                    left, error = await self._attempt(left)
                    if not left:
                        break
        finally:
            self._queued -= 1
        self._outage.end("publish")

    async def _attempt(self, messages: list[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], BaseException | None]:
        """SPUBLISH each message once; return those that met a failover, and its error."""
        try:
            await self._cluster.initialize()
            by_node: dict[str, list[tuple[str, bytes]]] = {}
            for message in messages:
                by_node.setdefault(self._cluster.get_node_from_key(message[0]).name, []).append(message)
        except (*_SEND_ERRORS, AttributeError) as error:
            if not _retried(error):
                raise
            return messages, error
        # One pipeline per master: a master that fails fails only its own messages, and no
        # message another master took is sent twice.
        outcomes = await asyncio.gather(*(self._attempt_on(batch) for batch in by_node.values()))
        return [message for failed, _ in outcomes for message in failed], next(
            (error for _, error in outcomes if error is not None), None
        )

    async def _attempt_on(self, batch: list[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], BaseException | None]:
        pipe = self._cluster.pipeline(transaction=False)
        for channel, payload in batch:
            pipe.execute_command("SPUBLISH", channel, payload)
        try:
            results = await pipe.execute(raise_on_error=False)
        except (*_SEND_ERRORS, AttributeError) as error:
            if not _retried(error):
                raise
            return batch, error
        failed, error = [], None
        for message, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                if not _retried(result):
                    raise result
                failed.append(message)
                error = result
        return failed, error

    async def flush(self) -> None:
        if self._sharded is not None:
            await self._sharded.close()
            await self._sharded.cluster.aclose()
            await self._cluster.aclose()
        self._sharded = self._cluster = None


class RelayClusterLoopLayer(RelayPubSubLoopLayer):
    """The per-event-loop half of `RelayClusterChannelLayer`."""

    def __init__(
        self,
        cluster_nodes: Sequence[Sequence[Any]],
        cluster_options: dict[str, Any] | None = None,
        publish_retry_seconds: float = PUBLISH_RETRY_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        nodes = [(str(host), int(port)) for host, port in cluster_nodes]
        self._shards = [_ClusterShard(nodes, dict(cluster_options or {}), self, publish_retry_seconds)]

    def publications(self, sends: Sequence[tuple[str, dict]], redis_url: str) -> None:
        """None: no script on one master may publish to shard channels of other slots."""
        return None

    def group_channel_prefix(self, prefix: str, redis_url: str) -> None:
        """None: no script on one master may publish to shard channels of other slots."""
        return None


class RelayClusterChannelLayer(RelayPubSubChannelLayer):
    """`RelayPubSubChannelLayer` on a Redis Cluster.

    CONFIG: `{"cluster_nodes": [[host, port], ...], "cluster_options": {redis-py's username,
    password, ssl}, "publish_retry_seconds": how long a send waits for its slot's master, "prefix": ...}`.
    """

    def _get_layer(self) -> RelayClusterLoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = RelayClusterLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)
        return layer
