"""Relay on a Redis that fails over (Sentinel) or restarts empty, without restarting any instance.

A master, a replica and three sentinels, all the same redis-server binary on loopback, with short
sentinel timings; two real Daphne processes reach the master only through the sentinels
(RELAY_REDIS_SENTINELS: RELAY_REDIS_URL's host is a name nothing resolves).
"""

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis, EmbeddedSentinel
from tests.support import (
    GRACE,
    MARGIN,
    WAIT,
    add_user,
    barrier,
    close_all,
    connect,
    heard,
    http,
    logged,
    states,
    timings,
    until,
)

pytestmark = pytest.mark.live

DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 2000
TTL, REFRESH = 8000, 500


def master_port(sentinel: EmbeddedSentinel) -> int:
    client = redis.Redis(host="127.0.0.1", port=sentinel.port, socket_timeout=0.5)
    try:
        return int(client.execute_command("SENTINEL", "get-master-addr-by-name", sentinel.master)[1])
    finally:
        client.close()


def ready(sentinel: EmbeddedSentinel) -> bool:
    """The sentinel knows the replica and both other sentinels: it can vote and fail over."""
    client = redis.Redis(host="127.0.0.1", port=sentinel.port, socket_timeout=0.5)
    try:
        replicas = client.execute_command("SENTINEL", "replicas", sentinel.master)
        others = client.execute_command("SENTINEL", "sentinels", sentinel.master)
        return len(replicas) == 1 and len(others) == 2
    finally:
        client.close()


@pytest.fixture
def sentinel_redis() -> Iterator[tuple[EmbeddedRedis, EmbeddedRedis, list[EmbeddedSentinel]]]:
    master = EmbeddedRedis().start()
    replica = EmbeddedRedis(extra_args=("--replicaof", "127.0.0.1", str(master.port))).start()
    started = [master, replica]
    try:
        client = redis.Redis(host="127.0.0.1", port=replica.port)
        deadline = time.monotonic() + WAIT
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        client.close()
        sentinels = [
            EmbeddedSentinel(master.port, down_after_ms=DOWN_AFTER_MS, failover_timeout_ms=FAILOVER_TIMEOUT_MS).start()
            for _ in range(3)
        ]
        started += sentinels
        deadline = time.monotonic() + WAIT
        while not all(ready(sentinel) for sentinel in sentinels):
            assert time.monotonic() < deadline, "the sentinels never found each other and the replica"
            time.sleep(0.1)
        yield master, replica, sentinels
    finally:
        for server in reversed(started):
            server.close()


async def test_a_sentinel_failover_loses_no_transition_message_or_user(live_instances, acme, sentinel_redis, closing):
    master, replica, sentinels = sentinel_redis
    # A TTL longer than the failover takes, as in production (30 s against seconds): keys
    # refreshed just before the master died outlive its absence on the promoted replica.
    a, b = live_instances(
        2,
        RELAY_REDIS_URL="redis://relay-redis-master/0",
        RELAY_REDIS_SENTINELS=",".join(sentinel.address for sentinel in sentinels),
        **timings(ttl=TTL, refresh=REFRESH),
    )
    await add_user(acme, "mai", ("general",))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    mai = await closing(connect(b, acme, "mai"))
    assert await heard(linh, "tuan", 1) == ["online"]
    assert await heard(linh, "mai", 1) == ["online"]

    master.kill()
    # mai leaves while the master is gone.
    await mai.close()
    await until(lambda: master_port(sentinels[0]) == replica.port, timeout=WAIT)
    failed_over = time.monotonic()

    # Without restarting anything: mai's departure is said once, a new arrival reaches the
    # watchers connected before, and messages flow both ways.
    assert await heard(linh, "mai", 2, timeout=(GRACE + MARGIN + 2 * REFRESH) / 1000 + WAIT) == ["online", "offline"]
    await add_user(acme, "kim", ("general",))
    kim = await closing(connect(a, acme, "kim"))
    assert await heard(tuan, "kim", 1) == ["online"]
    assert await heard(linh, "kim", 1) == ["online"]
    fleet = str(acme.channels["fleet"].id)
    assert (await linh.send_and_ack({"idem_key": "k-1", "channel": fleet, "text": "still there?"}))["type"] == (
        "message.ack"
    )
    created = await tuan.next_of("message.created")
    assert (created["user"], created["text"]) == ("linh", "still there?")
    assert time.monotonic() - failed_over < REFRESH / 1000 + WAIT

    # Nobody still connected was ever said to have left, and mai left once.
    await asyncio.sleep((GRACE + MARGIN + 2 * REFRESH) / 1000)
    probe = await barrier(b, acme, [linh, tuan])
    assert states(linh, "tuan") == ["online"]
    assert "offline" not in states(tuan, "linh")
    assert states(linh, "mai") == ["online", "offline"]
    assert states(tuan, "kim") == ["online"]
    await close_all(linh, tuan, kim, probe)


async def test_the_layer_subscribes_again_after_its_redis_restarts_empty(live_instances, acme, closing):
    private = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, RELAY_REDIS_URL=private.url, **timings())
        linh = await closing(connect(a, acme, "linh"))
        tuan = await closing(connect(b, acme, "tuan"))
        assert await heard(linh, "tuan", 1) == ["online"]
        private.stop()
        private.start()  # empty: persistence is off
        # Each instance's layer reconnects and subscribes again by itself (pub/sub keeps nothing
        # for the moments before it has: docs/presence.md); then the watcher connected before the
        # restart hears a new arrival and a message.
        for instance in (a, b):
            await logged(instance, "layer.reconnected")
        await add_user(acme, "kim", ("general",))
        kim = await closing(connect(b, acme, "kim"))
        assert await heard(linh, "kim", 1, timeout=WAIT) == ["online"]
        fleet = str(acme.channels["fleet"].id)
        assert (await tuan.send_and_ack({"idem_key": "k-1", "channel": fleet, "text": "after"}))["type"] == (
            "message.ack"
        )
        created = await linh.next_of("message.created")
        assert (created["user"], created["text"]) == ("tuan", "after")
        assert states(linh, "tuan") == ["online"]
        await close_all(linh, tuan, kim)
    finally:
        private.close()


def readiness(instance) -> tuple[int, object]:
    return http("GET", f"{instance.http_url}/readyz")


async def test_a_rediss_url_through_the_sentinels_keeps_tls(live_instances):
    # The master speaks plain text only: a client that keeps TLS cannot talk to it, and one that
    # dropped TLS (its traffic in clear on the network) can.
    with EmbeddedRedis() as master, EmbeddedSentinel(master.port) as sentinel:
        through = {"RELAY_REDIS_SENTINELS": sentinel.address}
        (plain,) = live_instances(1, RELAY_REDIS_URL="redis://relay-redis-master/0", **through)
        (tls,) = live_instances(1, RELAY_REDIS_URL="rediss://relay-redis-master/0", **through)
        status, body = readiness(plain)
        assert (status, body["checks"]["redis"]) == (200, "ok")
        status, body = readiness(tls)
        assert status == 503
        assert body["checks"]["redis"] != "ok"
