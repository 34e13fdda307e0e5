"""The mechanisms issue 6's optimisations added: secret cache, membership bus, Relay's layer, copy counts.

Each is checked for what it must keep true (a rotated secret, a membership change raced with
a connect, a message to a consumer of another process), against the real Redis.
"""

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import jwt
import pytest
import redis
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from presence.extension import STATE_KEY, PresenceExtension, presence_transition
from presence.fabric import Dedup, parse_transition, transition_message
from presence.store import PresenceStore, Timings
from relay import consumers, membership, registry, tokens
from relay.asgi import application
from relay.embedded_redis import EmbeddedRedis
from relay.exceptions import InvalidToken
from relay.layers import (
    RelayPubSubChannelLayer,
    group_add_many,
    group_discard_many,
    group_send_many,
    publications,
)
from relay.logging import event_fields
from relay.models import Environment, User
from relay.redis_client import pack_with_hiredis
from relay.tokens import verify_token

# ── the signing-secret cache ─────────────────────────────────────────────────
ELSEWHERE = "a-secret-another-process-rotated-to-0123456789"


@pytest.fixture(autouse=True)
def _empty_secret_cache() -> None:
    tokens._environments.clear()


def _signed(environment: Environment, secret: str, user_id: str) -> str:
    now = datetime.now(UTC)
    claims = {"env": str(environment.id), "sub": user_id, "iat": now, "exp": now + timedelta(minutes=5)}
    return jwt.encode(claims, secret, algorithm="HS256")


def _environment_reads(queries: CaptureQueriesContext) -> int:
    return sum('FROM "relay_environment"' in query["sql"] for query in queries.captured_queries)


@pytest.mark.django_db(transaction=True)
async def test_connects_waiting_for_the_database_hop_share_the_next_one(acme, monkeypatch):
    hops: list[list] = []
    read_in_worker = consumers._read_in_worker

    async def a_slow_first_hop(reads):
        hops.append([token for token, _ in reads])
        if len(hops) == 1:
            await asyncio.sleep(0.3)  # the others arrive meanwhile
        return await read_in_worker(reads)

    monkeypatch.setattr(consumers, "_read_in_worker", a_slow_first_hop)
    tokens = [acme.token("linh"), acme.token("tuan"), "forged", acme.token("hermit")]
    communicators = [WebsocketCommunicator(application, f"/v1/ws?token={token}") for token in tokens]
    first = asyncio.ensure_future(communicators[0].connect(timeout=5))
    await asyncio.sleep(0.1)
    await asyncio.gather(*(communicator.connect(timeout=5) for communicator in communicators[1:]))
    await first
    # One hop for the first connect, ONE for the three that came while it was in flight.
    assert hops == [[tokens[0]], tokens[1:]]
    # Each got its own outcome: the forged one alone is refused.
    outputs = [await communicator.receive_output(timeout=5) for communicator in communicators]
    outcomes = [
        json.loads(output["text"])["payload"]["user"] if output["type"] == "websocket.send" else output["code"]
        for output in outputs
    ]
    assert outcomes == ["linh", "tuan", 4401, "hermit"]
    for communicator in communicators:
        await communicator.disconnect()


def _presence() -> PresenceExtension:
    return next(ext for ext in registry.extensions if isinstance(ext, PresenceExtension))


def test_a_hop_reads_its_connects_users_channels_and_co_members_with_one_query_each(acme, globex):
    acme.add_user("solo")
    acme.add_channel("den", "private", members=("hermit", "solo"))
    presence = _presence()
    reads = [
        (acme.token("linh"), [presence]),
        (acme.token("hermit"), [presence]),
        ("forged", [presence]),
        (acme.token("nobody"), [presence]),
        (globex.token("linh"), [presence]),
        (acme.token("tuan"), []),
        (acme.token("linh"), [presence]),  # her second device, in the same batch
    ]
    with CaptureQueriesContext(connection) as queries:
        linh, hermit, forged, nobody, globex_linh, tuan, linh_again = consumers._read_sessions(reads)
    # Each connect gets its own user, channels and co-members, never another's of the batch.
    assert (linh.user.external_id, linh.user.environment) == ("linh", acme.environment)
    assert linh.channel_ids == {str(acme.channels["fleet"].id), str(acme.channels["general"].id)}
    assert linh.loaded[presence] == ["linh", "tuan"]
    assert hermit.channel_ids == {str(acme.channels["den"].id)}
    assert hermit.loaded[presence] == ["hermit", "solo"]
    assert (globex_linh.user.environment, globex_linh.loaded[presence]) == (globex.environment, ["linh", "zed"])
    assert tuan.channel_ids == linh.channel_ids and presence not in tuan.loaded
    assert linh_again.user.pk == linh.user.pk
    assert (linh_again.channel_ids, linh_again.loaded) == (linh.channel_ids, linh.loaded)
    assert isinstance(forged, InvalidToken) and isinstance(nobody, InvalidToken)
    # One read of the users per environment, one of all their channels, one of those channels' members.
    reads_sql = [query["sql"] for query in queries.captured_queries if '"relay_environment"' not in query["sql"]]
    assert [sql.split(" FROM ")[1].split()[0] for sql in reads_sql] == [
        '"relay_user"',
        '"relay_user"',
        '"relay_membership"',
        '"relay_membership"',
    ]


def test_a_database_error_fails_the_hops_verified_connects_and_a_forged_token_stays_refused(acme, monkeypatch):
    def unavailable(user_pks):
        raise OperationalError("database is locked")

    monkeypatch.setattr(consumers, "channel_ids_of_users", unavailable)
    linh, forged = consumers._read_sessions([(acme.token("linh"), []), ("forged", [])])
    assert isinstance(linh, OperationalError)
    assert isinstance(forged, InvalidToken)


def test_a_failing_load_is_logged_and_its_connects_open_without_it(acme, monkeypatch, caplog):
    presence = _presence()

    def broken(sessions):
        raise OperationalError("database is locked")

    monkeypatch.setattr(presence, "load", broken)
    (linh,) = consumers._read_sessions([(acme.token("linh"), [presence])])
    assert linh.user.external_id == "linh" and presence not in linh.loaded
    failures = [event_fields(record) for record in caplog.records if record.getMessage() == "connection.hook_failed"]
    assert failures == [{"hook": "PresenceExtension.load", "error": "OperationalError"}]


def test_a_connect_reads_the_users_ids_only_and_the_rest_loads_on_first_access(acme):
    with CaptureQueriesContext(connection) as connect:
        user = verify_token(acme.token("linh"))
    stored = User.objects.get(pk=user.pk)
    assert (user.environment_id, user.external_id) == (stored.environment_id, stored.external_id)
    assert user.environment == acme.environment  # the cached environment, no query
    assert user.get_deferred_fields() == {"name", "created_at"}
    assert [query["sql"].count('"relay_user"."name"') for query in connect.captured_queries] == [0, 0]
    assert (user.name, user.created_at) == (stored.name, stored.created_at)
    assert user.get_deferred_fields() == set()


def test_the_secret_is_read_once_then_served_from_the_cache(acme):
    with CaptureQueriesContext(connection) as first:
        assert verify_token(acme.token("linh")).external_id == "linh"
    with CaptureQueriesContext(connection) as second:
        assert verify_token(acme.token("tuan")).external_id == "tuan"
    assert _environment_reads(first) == 1
    assert _environment_reads(second) == 0


def test_a_rotation_in_this_process_refuses_the_old_secret_at_once(acme):
    before = acme.token("linh")
    assert verify_token(before).external_id == "linh"  # cached now
    acme.environment.rotate_signing_secret()
    with pytest.raises(InvalidToken):
        verify_token(before)
    assert verify_token(acme.token("linh")).external_id == "linh"


def test_a_secret_rotated_by_another_process_is_accepted_at_once(acme):
    old = acme.environment.signing_secret
    assert verify_token(_signed(acme.environment, old, "linh")).external_id == "linh"  # cached now
    # Another process rotates: the row changes, this process's cache is not told.
    Environment.objects.filter(id=acme.environment.id).update(signing_secret=ELSEWHERE)
    assert verify_token(_signed(acme.environment, ELSEWHERE, "linh")).external_id == "linh"
    # The fresh read replaced the cached secret, so the old one is refused from then on.
    with pytest.raises(InvalidToken):
        verify_token(_signed(acme.environment, old, "linh"))


def test_a_cached_secret_expires(acme, monkeypatch):
    old = acme.environment.signing_secret
    monkeypatch.setattr(tokens, "SECRET_CACHE_SECONDS", 0.0)
    assert verify_token(_signed(acme.environment, old, "linh")).external_id == "linh"
    Environment.objects.filter(id=acme.environment.id).update(signing_secret=ELSEWHERE)
    # Expired at once: the old token is checked against the database's secret and refused.
    with pytest.raises(InvalidToken):
        verify_token(_signed(acme.environment, old, "linh"))


def test_unknown_environments_are_not_cached(acme):
    stranger = Environment(id=uuid.uuid4(), name="never saved")
    with pytest.raises(InvalidToken):
        verify_token(_signed(stranger, ELSEWHERE, "linh"))
    assert verify_token(acme.token("linh")).external_id == "linh"
    assert set(tokens._environments) == {acme.environment.id}


# ── the membership bus ───────────────────────────────────────────────────────
async def _open(token: str) -> tuple[WebsocketCommunicator, dict]:
    communicator = WebsocketCommunicator(application, f"/v1/ws?token={token}")
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    ack = json.loads(await communicator.receive_from(timeout=5))
    assert ack["type"] == "connection.ack"
    return communicator, ack["payload"]


@pytest.mark.django_db(transaction=True)
async def test_a_connect_that_falls_behind_the_bus_memory_reads_its_channels_again(acme, monkeypatch):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    monkeypatch.setattr(membership, "RECENT_CHANGES", 2)
    read_session = consumers.open_session
    reads = []

    async def busy_bus_meanwhile(token, extensions):
        session = await read_session(token, extensions)
        reads.append("session")
        # After the read: linh leaves fleet, then more changes than the bus remembers go by.
        await database_sync_to_async(membership.remove_member)(fleet, session.user)
        for _ in range(2):
            await database_sync_to_async(membership.remove_member)(general, acme.users["tuan"])
            await database_sync_to_async(membership.add_member)(general, acme.users["tuan"])
        bus = membership.bus()
        for _ in range(100):
            if bus.seq >= 5:
                break
            await asyncio.sleep(0.02)
        return session

    monkeypatch.setattr(consumers, "open_session", busy_bus_meanwhile)
    read_channels = consumers.channels_of

    async def counted(user):
        reads.append("channels")
        return await read_channels(user)

    monkeypatch.setattr(consumers, "channels_of", counted)
    linh, ack = await _open(acme.token("linh"))
    assert reads == ["session", "channels"]
    assert ack["channels"] == [str(general.id)]
    await linh.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_connect_within_the_bus_memory_reads_once_and_gets_the_change_replayed(acme, monkeypatch):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    read_session = consumers.open_session

    async def removed_after_the_read(token, extensions):
        session = await read_session(token, extensions)
        await database_sync_to_async(membership.remove_member)(fleet, session.user)
        bus = membership.bus()
        for _ in range(100):
            if bus.seq >= 1:
                break
            await asyncio.sleep(0.02)
        return session

    monkeypatch.setattr(consumers, "open_session", removed_after_the_read)
    linh, ack = await _open(acme.token("linh"))
    # The read saw fleet; the removal that came after it is replayed, not lost.
    assert sorted(ack["channels"]) == sorted([str(fleet.id), str(general.id)])
    layer = get_channel_layer()
    await layer.group_send(f"messages.{fleet.id}", {"type": "message.created", "message": {}})
    await layer.group_send(
        f"messages.{general.id}",
        {
            "type": "message.created",
            "message": {
                "id": "m",
                "channel": str(general.id),
                "seq": 1,
                "user": "tuan",
                "text": "t",
                "created_at": "x",
            },
        },
    )
    created = []
    while not created:
        frame = json.loads(await linh.receive_from(timeout=5))
        if frame["type"] == "message.created":
            created.append(frame["payload"]["channel"])
    assert created == [str(general.id)]
    assert membership.bus().listeners  # linh is listening
    await linh.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_closed_connection_stops_listening_on_the_bus(acme):
    linh, _ = await _open(acme.token("linh"))
    pk = acme.users["linh"].pk
    assert pk in membership.bus().listeners
    await linh.disconnect()
    assert pk not in membership.bus().listeners


# ── Relay's pub/sub layer ────────────────────────────────────────────────────
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
        await group_send_many(layer, [(group, {"type": "t", "group": group}) for group in members])
        for group, channel in members.items():
            assert await layer.receive(channel) == {"type": "t", "group": group}
        assert _publishes(own_redis) == publishes + 3
    finally:
        await layer.flush()


async def test_group_send_many_falls_back_to_one_group_send_each_on_other_layers(redis_url):
    from channels_redis.core import RedisChannelLayer

    layer = RedisChannelLayer(hosts=[redis_url], prefix="relay-core-test")
    try:
        members = {}
        for group in ("g.one", "g.two"):
            members[group] = await layer.new_channel()
            await layer.group_add(group, members[group])
        await group_send_many(layer, [(group, {"type": "t", "group": group}) for group in members])
        for group, channel in members.items():
            assert await layer.receive(channel) == {"type": "t", "group": group}
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
        await group_add_many(layer, ["g.a", "g.b", "g.shared"], first)
        # One SUBSCRIBE for the two groups new to the process; the shared one was already there.
        assert _subscribes(own_redis) == subscribes + 1
        numsub = dict(own_redis.pubsub_numsub("relay__group__g.a", "relay__group__g.b"))
        assert numsub == {"relay__group__g.a": 1, "relay__group__g.b": 1}
        await _layer(own_redis_url).group_send("g.b", {"type": "ping"})
        assert await layer.receive(first) == {"type": "ping"}

        unsubscribes = _unsubscribes(own_redis)
        await group_discard_many(layer, ["g.a", "g.b", "g.shared"], first)
        # One UNSUBSCRIBE, for the groups nobody here is left in; the other member keeps g.shared.
        assert _unsubscribes(own_redis) == unsubscribes + 1
        assert dict(own_redis.pubsub_numsub("relay__group__g.a"))["relay__group__g.a"] == 0
        await _layer(own_redis_url).group_send("g.shared", {"type": "still"})
        assert await layer.receive(second) == {"type": "still"}
    finally:
        await layer.flush()


async def test_joining_and_leaving_many_falls_back_to_one_call_each_on_other_layers(redis_url):
    from channels_redis.core import RedisChannelLayer

    layer = RedisChannelLayer(hosts=[redis_url], prefix="relay-core-many")
    try:
        channel = await layer.new_channel()
        await group_add_many(layer, ["g.one", "g.two"], channel)
        await layer.group_send("g.two", {"type": "t"})
        assert await layer.receive(channel) == {"type": "t"}
        await group_discard_many(layer, ["g.one", "g.two"], channel)
        await layer.group_send("g.two", {"type": "gone"})
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layer.receive(channel), 0.3)
    finally:
        await layer.flush()


async def test_publications_are_what_a_group_send_publishes_on_the_layers_own_redis(redis_url, redis_client):
    layer = _layer(redis_url)
    try:
        channel = await layer.new_channel()
        await layer.group_add("g.scripted", channel)
        prepared = publications(layer, [("g.scripted", {"type": "t", "n": 1})], redis_url)
        assert [name for name, _ in prepared] == ["relay__group__g.scripted"]
        # PUBLISHed by anyone (here: this test; in Relay: a presence script), it is that group send.
        redis_client.publish(*prepared[0])
        assert await layer.receive(channel) == {"type": "t", "n": 1}
        # Groups on another Redis, or another layer: no answer, and the caller sends as usual.
        assert publications(layer, [("g.scripted", {"type": "t"})], "redis://elsewhere:6379/0") is None
        assert publications(object(), [("g.scripted", {"type": "t"})], redis_url) is None
    finally:
        await layer.flush()


# ── transitions that say how many copies exist ───────────────────────────────
class _Watcher:
    """Just what presence's event handler reads of a connection."""

    def __init__(self, *channels: str) -> None:
        self.channel_ids = set(channels)
        self.state = {STATE_KEY: Dedup()}
        self.frames: list[dict] = []

    async def send_frame(self, frame_type: str, payload: dict) -> None:
        self.frames.append({"type": frame_type, "payload": payload})


async def test_a_single_copy_is_delivered_without_remembering_its_id():
    fleet, general = str(uuid.uuid4()), str(uuid.uuid4())
    watcher = _Watcher(fleet, general)
    await presence_transition(watcher, transition_message("tuan", "online", str(uuid.uuid4()), fleet, copies=1))
    assert watcher.frames == [{"type": "presence.changed", "payload": {"user": "tuan", "state": "online"}}]
    assert len(watcher.state[STATE_KEY]) == 0


async def test_several_copies_are_still_delivered_once():
    fleet, general = str(uuid.uuid4()), str(uuid.uuid4())
    watcher = _Watcher(fleet, general)
    transition = str(uuid.uuid4())
    for channel in (fleet, general):
        await presence_transition(watcher, transition_message("tuan", "offline", transition, channel, copies=2))
    assert watcher.frames == [{"type": "presence.changed", "payload": {"user": "tuan", "state": "offline"}}]
    assert len(watcher.state[STATE_KEY]) == 1


def test_a_copy_count_must_be_a_positive_integer():
    channel = str(uuid.uuid4())
    good = transition_message("linh", "online", str(uuid.uuid4()), channel, copies=3)
    assert parse_transition(good).copies == 3
    assert parse_transition(transition_message("linh", "online", str(uuid.uuid4()), channel)).copies is None
    for bad in (0, -1, "2", 1.5, None):
        assert parse_transition({**good, "copies": bad}) is None


async def test_a_claimed_group_is_handed_over_once_with_its_members_and_others_are_queued(redis_url):
    layer = _layer(redis_url)
    try:
        first, second = await layer.new_channel(), await layer.new_channel()
        claimed: list[tuple[dict, tuple[str, ...]]] = []
        layer.claim_groups("presence.", lambda message, members: claimed.append((message, members)))
        for channel in (first, second):
            await group_add_many(layer, ["presence.fleet", "messages.fleet"], channel)
        await group_send_many(_layer(redis_url), [("presence.fleet", {"type": "p"}), ("messages.fleet", {"type": "m"})])
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
        await group_add_many(layer, ["messages.fleet"], channel)
        assert layer.send_local(channel, {"type": "a"})
        await _layer(redis_url).group_send("messages.fleet", {"type": "b"})
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


# ── commands packed by hiredis ───────────────────────────────────────────────
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
    layer = _layer(redis_url)
    store = PresenceStore(redis_url, Timings(grace=100, ttl=1000, refresh=300, margin=10, max_connections=5))
    try:
        channel = await layer.new_channel()
        await group_add_many(layer, ["messages.packed"], channel)
        await _layer(redis_url).group_send("messages.packed", {"type": "ünïcode", "blob": b"\x00\xff"})
        assert await layer.receive(channel) == {"type": "ünïcode", "blob": b"\x00\xff"}
        env = str(uuid.uuid4())
        assert await store.admit(env, "linh", "c1") == (True, True)
        assert await store.admit(env, "linh", "c2") == (True, False)
        assert await store.online(env, ["linh", "tuan"]) == ["linh"]
        classes = {type(connection).__name__ for connection in store.client.connection_pool._available_connections}
        classes |= {type(layer._shards[0]._pubsub.connection).__name__}
        assert classes == {"HiredisConnection"}
    finally:
        await layer.flush()
        await store.close()
