"""Guards of the patches in relay/transport: each fails as soon as upstream changes what a patch relies on."""

import uuid

import pytest
import redis

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
