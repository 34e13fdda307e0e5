"""Guards of the patches in relay/transport: each fails as soon as upstream changes what a patch relies on."""

import inspect
import pprint
import uuid
from importlib.metadata import version

import pytest
import redis
from twisted.internet.defer import Deferred

from presence.store import PresenceStore, Timings
from relay.transport.hiredis import pack_with_hiredis
from relay.transport.pubsub import RelayPubSubChannelLayer


def _python_packed(*commands: tuple) -> bytes:
    # redis-py's own asyncio packer, the reference for the bytes on the wire.
    connection = redis.asyncio.Connection()
    return b"".join(redis.asyncio.Connection.pack_commands(connection, commands))


@pytest.mark.parametrize(
    "command",
    [
        ("EVALSHA", "0123abcd", 2, "presence:k", b"raw\x00bytes", 30_000, 1.5, "ünïcode"),
        ("CLIENT SETNAME", "relay"),
        (b"CLIENT SETNAME", "relay"),
        ("PUBLISH", "", b""),
    ],
)
def test_hiredis_packs_the_bytes_redis_pys_python_packer_would(command):
    pool = pack_with_hiredis(redis.asyncio.ConnectionPool.from_url("redis://127.0.0.1:1/0"))
    connection = pool.make_connection()
    assert type(connection).__name__ == "HiredisConnection"
    assert b"".join(connection.pack_command(*command)) == _python_packed(command)
    assert b"".join(connection.pack_commands([command, ("PING",)])) == _python_packed(command, ("PING",))


def test_hiredis_packing_keeps_the_urls_connection_class_and_redis_pys_error():
    pool = pack_with_hiredis(redis.asyncio.ConnectionPool.from_url("unix:///tmp/relay-test.sock"))
    mixed = pool.connection_class
    # Mixed in once, however often it is asked for.
    assert pack_with_hiredis(pool).connection_class is mixed
    connection = pool.make_connection()
    assert isinstance(connection, redis.asyncio.UnixDomainSocketConnection)
    assert connection.pack_command("GET", "k") == [b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"]
    with pytest.raises(redis.DataError):
        connection.pack_command("SET", "k", None)


async def test_the_layer_and_the_presence_store_pack_with_hiredis_against_the_real_redis(redis_url):
    layer = RelayPubSubChannelLayer(hosts=[redis_url], prefix="relay")
    store = PresenceStore(redis_url, Timings(grace=100, ttl=1000, refresh=300, margin=10, max_connections=5))
    try:
        channel = await layer.new_channel()
        await layer.group_add_many(["chat.packed"], channel)
        await RelayPubSubChannelLayer(hosts=[redis_url], prefix="relay").group_send(
            "chat.packed", {"type": "ünïcode", "blob": b"\x00\xff"}
        )
        assert await layer.receive(channel) == {"type": "ünïcode", "blob": b"\x00\xff"}
        env = str(uuid.uuid4())
        election = await store.elect(env, "linh", "c1")
        assert (election.admitted, election.won) == (True, True)
        election = await store.elect(env, "linh", "c2")
        assert (election.admitted, election.won) == (True, False)
        assert await store.online(env, ["linh", "tuan"]) == ["linh"]
        classes = {type(connection).__name__ for connection in store.client.connection_pool._available_connections}
        classes |= {type(layer._shards[0]._pubsub.connection).__name__}
        assert classes == {"HiredisConnection"}
    finally:
        await layer.flush()
        await store.close()


# ── versions: each patch names the upstream range it was written for ─────────
def _version(distribution: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version(distribution).split(".")[:2])


@pytest.mark.parametrize(
    "distribution, lowest, beyond",
    [
        ("channels", (4, 2), (4, 4)),  # relay/transport/channels_dispatch.py
        ("channels-redis", (4, 3), (4, 4)),  # relay/transport/pubsub.py
        ("redis", (5, 0), (7, 0)),  # relay/transport/hiredis.py, cluster.py
        ("daphne", (4, 1), (4, 3)),  # relay/transport/websocket_options.py, daphne_server.py
        ("autobahn", (26, 1), (27, 0)),  # relay/transport/websocket_options.py, autobahn_debug.py
    ],
)
def test_each_patched_library_is_a_version_its_patch_was_written_for(distribution, lowest, beyond):
    assert lowest <= _version(distribution) < beyond, (
        f"{distribution} {version(distribution)} is outside the range relay/transport was written for: "
        "check the patch against it, then widen the range here and in requirements.txt"
    )


# ── the pub/sub layer: what it overrides and reads of channels-redis ──────────
def test_channels_redis_still_has_what_the_layer_overrides_and_reads():
    from channels_redis import pubsub

    shard = pubsub.RedisSingleShardConnection({"address": "redis://127.0.0.1:1/0"}, object())
    # Overridden: the receive loop, the message routing, (un)subscribe and publish.
    for name in ("_do_receiving", "_receive_message", "_ensure_redis", "_ensure_receiver", "subscribe", "publish"):
        assert callable(getattr(pubsub.RedisSingleShardConnection, name)), name
    # Read: the shard's state, set in its constructor.
    for name in ("host", "channel_layer", "_lock", "_subscribed_to", "_redis", "_pubsub", "_receive_task"):
        assert hasattr(shard, name), name
    loop_layer = pubsub.RedisPubSubLoopLayer(hosts=["redis://127.0.0.1:1/0"], prefix="relay")
    for name in ("_get_shard", "_get_group_channel_name", "_shards", "channels", "groups", "prefix"):
        assert hasattr(loop_layer, name), name
    assert loop_layer._get_group_channel_name("g") == "relay__group__g"
    assert "_layers" in vars(pubsub.RedisPubSubChannelLayer(hosts=["redis://127.0.0.1:1/0"]))


# ── the cluster layer: what it reads of redis-py's asyncio cluster client ─────
def test_redis_pys_asyncio_cluster_client_still_has_what_the_cluster_layer_reads():
    from channels_redis.utils import _wrap_close
    from redis.asyncio.cluster import ClusterNode, NodesManager, RedisCluster

    from relay.transport.cluster import cluster_client

    # No pub/sub of its own yet: when it has one (redis-py 8), the subscribing side should go.
    assert not hasattr(RedisCluster, "pubsub")
    client = cluster_client([("127.0.0.1", 1)])
    assert isinstance(client.nodes_manager, NodesManager)
    assert inspect.iscoroutinefunction(NodesManager.initialize)
    assert client.keyslot("relay__group__g") == 4249
    for name in ("initialize", "get_node_from_key", "execute_command", "pipeline", "aclose"):
        assert callable(getattr(client, name)), name
    node = ClusterNode("127.0.0.1", 1)
    assert node.name == "127.0.0.1:1"
    connection = node.connection_class(**node.connection_kwargs)
    assert (connection.host, connection.port) == ("127.0.0.1", 1)
    assert callable(_wrap_close)
    # A slot's nodes, its master first and then its replicas: where the layer subscribes.
    assert client.nodes_manager.slots_cache == {}
    source = inspect.getsource(NodesManager.initialize)
    assert "nodes_for_slot.append(target_node)" in source
    assert "nodes_for_slot.append(target_replica_node)" in source
    # The publishing client is built without retries: redis-py's pipeline retry sends again every
    # command whose answer is falsy (an SPUBLISH that no client on that node heard) with the failed ones.
    assert "not cmd.result" in inspect.getsource(redis.asyncio.cluster.PipelineStrategy._execute)


def test_redis_pys_asyncio_connection_still_writes_on_a_writer_a_disconnect_cleared():
    # relay.transport.cluster.closed_under_a_write takes the AttributeError for a failure
    # (redis/redis-py#3546); once redis-py raises ConnectionError there (redis/redis-py#4288), it can go.
    from redis.asyncio.connection import Connection

    assert "self._writer.writelines(" in inspect.getsource(Connection._send_packed_command)


# ── websocket options: Daphne still leaves those autobahn options alone ───────
class StoppedReactor:
    """Just enough of Twisted's reactor for Daphne's `Server.run` to build its factories and return."""

    _asyncioEventloop = None

    def callLater(self, *args: object) -> None:
        pass

    def addSystemEventTrigger(self, *args: object) -> None:
        pass

    def run(self, **kwargs: object) -> None:
        pass


class UnlistenedEndpoint:
    """An endpoint that never listens (the factories are what the test reads)."""

    def listen(self, factory: object) -> Deferred:
        return Deferred()


def test_the_websocket_factory_daphne_builds_gives_a_peer_ten_seconds_and_a_close_code(monkeypatch):
    import daphne.server  # already imported with Django's apps: the `daphne` app is installed

    # Daphne's own run(), up to the reactor it would start: its factory, its own options set on
    # it after it was built. Relay's must survive them (or Daphne has options of its own now).
    monkeypatch.setattr(daphne.server, "reactor", StoppedReactor())
    monkeypatch.setattr(daphne.server.globalLogBeginner, "beginLoggingTo", lambda *args, **kwargs: None)
    monkeypatch.setattr(daphne.server.asyncio, "set_event_loop", lambda loop: None)
    monkeypatch.setattr(daphne.server, "serverFromString", lambda reactor, description: UnlistenedEndpoint())
    server = daphne.server.Server(application=None, endpoints=["tcp:0"], websocket_max_message_size=1234)
    server.run()
    factory = server.ws_factory
    assert factory.maxMessagePayloadSize == 1234  # Daphne's own options were applied
    assert (factory.closeHandshakeTimeout, factory.failByDrop) == (10.0, False)


# ── autobahn's debug arguments: still built with the module's `pformat` ───────
def test_autobahn_still_formats_its_connection_settings_through_its_module_name(monkeypatch):
    import autobahn.websocket.protocol as protocol

    from relay.transport import autobahn_debug

    # autobahn imports the name from pprint (this process already patched it: Django's apps are
    # set up), and each connection's debug line looks it up in the module when it runs.
    assert "from pprint import pformat" in inspect.getsource(protocol)
    assert "pformat" in protocol.WebSocketProtocol._connectionMade.__code__.co_names
    monkeypatch.setattr(protocol, "pformat", pprint.pformat)
    autobahn_debug.install()
    assert protocol.pformat([("utf8validateIncoming", True, "WebSocketFactory")]) == autobahn_debug.NOT_FORMATTED


# ── Channels' dispatch: still cleans up before every handler, which ours skips ─
class _Recorder:
    def __init__(self) -> None:
        self.handled: list[dict] = []

    async def chat_message(self, message: dict) -> None:
        self.handled.append(message)


async def test_channels_own_dispatch_still_closes_old_connections_before_each_handler(monkeypatch):
    from channels import consumer

    from relay.transport.channels_dispatch import DispatchWithoutCleanup

    cleanups = []

    async def counted() -> None:
        cleanups.append(1)

    monkeypatch.setattr(consumer, "aclose_old_connections", counted)

    class Channels(_Recorder, consumer.AsyncConsumer):
        pass

    class Relays(DispatchWithoutCleanup, _Recorder, consumer.AsyncConsumer):
        pass

    theirs, ours = Channels(), Relays()
    await theirs.dispatch({"type": "chat.message", "n": 1})
    # Upstream still hops to the database thread per message: the patch still saves that hop.
    assert (cleanups, theirs.handled) == ([1], [{"type": "chat.message", "n": 1}])
    await ours.dispatch({"type": "chat.message", "n": 2})
    assert (cleanups, ours.handled) == ([1], [{"type": "chat.message", "n": 2}])
    # An unknown type fails as it does upstream.
    for dispatcher in (theirs, ours):
        with pytest.raises(ValueError, match=r"No handler for message type chat\.unknown"):
            await dispatcher.dispatch({"type": "chat.unknown"})


# ── Daphne's server: the command line still builds `server_class`, with our access logger ─
def test_daphnes_command_line_builds_the_server_whose_access_log_has_no_query_strings(monkeypatch, tmp_path):
    from daphne.server import Server

    from relay.transport.daphne_server import command_line

    built: list[Server] = []
    monkeypatch.setattr(Server, "run", lambda server: built.append(server))
    access_log = tmp_path / "access.log"
    command_line().run(["--access-log", str(access_log), "-p", "1", "relay.asgi:application"])
    (server,) = built
    server.log_action("websocket", "connected", {"path": "/v1/ws?token=secret", "client": "127.0.0.1:1"})
    line = {"path": "/healthz?token=secret", "status": 200, "method": "GET", "client": "127.0.0.1:1", "size": 2}
    server.log_action("http", "complete", line)
    server.action_logger.access_log.stream.flush()
    lines = access_log.read_text()
    assert "/v1/ws" in lines and "/healthz" in lines
    assert "secret" not in lines and "token" not in lines


# ── inbound backpressure: Daphne still queues each frame in onMessage, and pausing holds ─
class PausableTransport:
    """A Twisted transport that records whether its reading was paused and resumed."""

    disconnected = False

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")


class Reactor:
    """The reactor's clock as relay.transport.inbound_backpressure reads it, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        # (delay, function, *arguments) of each callLater, in order.
        self.calls: list[tuple] = []


@pytest.fixture
def reactor_clock(monkeypatch) -> Reactor:
    from twisted.internet import reactor

    clock = Reactor()
    monkeypatch.setattr(reactor, "callLater", lambda delay, *call: clock.calls.append((delay, *call)))
    monkeypatch.setattr(reactor, "seconds", lambda: clock.now)
    return clock


@pytest.fixture
def bounded_protocol(monkeypatch, reactor_clock):
    """An open Daphne WebSocket protocol, inbound backpressure installed, on a PausableTransport."""
    import asyncio

    from daphne.ws_protocol import WebSocketProtocol

    from relay.transport import inbound_backpressure

    monkeypatch.setattr(WebSocketProtocol, "onMessage", WebSocketProtocol.onMessage)
    monkeypatch.setattr(WebSocketProtocol, "handle_reply", WebSocketProtocol.handle_reply)
    inbound_backpressure.install()
    protocol = WebSocketProtocol()
    protocol.application_queue, protocol.muted, protocol.client_addr = asyncio.Queue(), False, ("127.0.0.1", 1)
    protocol.transport = PausableTransport()
    return protocol


async def test_daphne_queues_frames_in_on_message_and_a_full_queue_pauses_the_socket(bounded_protocol, reactor_clock):
    from relay.transport import inbound_backpressure

    protocol = bounded_protocol
    for _ in range(inbound_backpressure.MAX_QUEUED_FRAMES):
        protocol.onMessage(b"{}", False)
    # Daphne's own behaviour, which the patch relies on: one queued message per frame, in order.
    assert protocol.application_queue.qsize() == inbound_backpressure.MAX_QUEUED_FRAMES
    assert protocol.application_queue.get_nowait() == {"type": "websocket.receive", "text": "{}"}
    assert protocol.transport.calls == []
    protocol.onMessage(b"{}", False)
    protocol.onMessage(b"{}", False)
    assert protocol.transport.calls == ["pause"]
    # Taken below half: the check that was scheduled resumes reading.
    while protocol.application_queue.qsize() > inbound_backpressure.MAX_QUEUED_FRAMES // 2:
        protocol.application_queue.get_nowait()
    _, check, *arguments = reactor_clock.calls[0]
    check(*arguments)
    assert protocol.transport.calls == ["pause", "resume"]


async def test_a_reply_asking_for_its_socket_to_be_left_unread_pauses_reading_until_that_time(
    bounded_protocol, reactor_clock, monkeypatch
):
    from relay.transport import inbound_backpressure

    protocol = bounded_protocol
    sent: list[tuple] = []
    monkeypatch.setattr(protocol, "serverSend", lambda content, binary: sent.append((content, binary)), raising=False)
    protocol.state = protocol.STATE_OPEN
    checks = reactor_clock.calls
    # A reply without the key is only sent; one with it is sent, then reading stops.
    protocol.handle_reply({"type": "websocket.send", "text": "plain"})
    assert (sent, protocol.transport.calls, checks) == ([("plain", False)], [], [])
    protocol.handle_reply({"type": "websocket.send", "text": "refused", inbound_backpressure.UNREAD_MS: 1000})
    assert sent[-1] == ("refused", False)
    assert protocol.transport.calls == ["pause"]
    # The check comes when the time is up, not before; a check early (the queue's) resumes nothing.
    delay, check, *arguments = checks.pop()
    assert delay == 1.0
    reactor_clock.now += 0.5
    check(*arguments)
    assert protocol.transport.calls == ["pause"]
    delay, check, *arguments = checks.pop()
    assert delay == 0.5
    reactor_clock.now += 0.5
    check(*arguments)
    assert protocol.transport.calls == ["pause", "resume"]


def test_a_cluster_pipeline_still_refuses_its_evalsha_method_and_routes_the_command_by_its_keys():
    # relay.transport.cluster.queue_script works around the refusal (redis/redis-py#2914); once
    # redis-py allows it (redis/redis-py#4206), pipe.evalsha can replace it.
    assert "EVALSHA" in redis.cluster.PIPELINE_BLOCKED_COMMANDS, "redis-py allows EVALSHA in a cluster pipeline now"
    assert "MGET" in redis.cluster.PIPELINE_BLOCKED_COMMANDS, "redis-py allows MGET in a cluster pipeline now"
    source = inspect.getsource(redis.asyncio.cluster.RedisCluster._determine_slot)
    assert '("EVAL", "EVALSHA")' in source and "keys = args[2 : 2 + int(args[1])]" in source
