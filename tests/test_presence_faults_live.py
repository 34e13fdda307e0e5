"""Presence against Redis faults that lose a publish or bring back old data, with real Daphne processes.

The cast (tests/conftest.py): in acme, linh and tuan share "fleet" (private) and "general".
Presence lives on a Redis of its own here (RELAY_PRESENCE_REDIS_URL), the channel layer on the
suite's: transitions are then published through the layer after the script decided them, and a
publish can fail on its own. Every "nothing arrived" sits after a barrier (tests/support.py).
"""

import asyncio
import os
import shutil
import signal
from collections.abc import Callable, Iterator

import pytest
import redis

from chaos.deploy import Proxy
from devtools.embedded_redis import EmbeddedRedis
from presence.actions import RECOVERING, STILL_OPEN, VANISHED
from presence.scripts import GRACE_CHECK, channels_key, marker_key, presence_key, user_epoch_key
from tests.support import (
    GRACE,
    REFRESH,
    TTL,
    Instance,
    add_user,
    barrier,
    close_all,
    connect,
    heard,
    lines,
    logged,
    states,
    timings,
    until,
)

pytestmark = pytest.mark.live


@pytest.fixture
def presence_redis() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture
def publish_refused(redis_url: str) -> Iterator[Callable[[bool], None]]:
    """Switch PUBLISH off (and on) for every client of the layer's Redis; back on when the test ends.

    An ACL rule rather than a stopped server: the publish fails as in a failover, while the
    watchers' subscriptions stay up, so what arrives afterwards shows what was retried.
    """
    client = redis.Redis.from_url(redis_url)

    def refuse(refused: bool) -> None:
        client.execute_command("ACL", "SETUSER", "default", "-publish" if refused else "+publish")

    yield refuse
    refuse(False)
    client.close()


async def test_a_failed_online_and_a_failed_offline_are_published_once_redis_takes_them(
    live_instances, acme, presence_redis, publish_refused
):
    a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
    store = redis.Redis.from_url(presence_redis.url)
    linh = await connect(a, acme, "linh")
    publish_refused(True)
    # tuan wins his election on the presence Redis; the `online` the layer should carry fails.
    tuan = await connect(b, acme, "tuan")
    await logged(b, "presence.failed", op="publish")
    publish_refused(False)
    assert await heard(linh, "tuan", 1) == ["online"]
    publish_refused(True)
    # His grace check decides `offline` (it takes the marker), and its publish fails the same way.
    failures = len(b.events("presence.failed"))
    await tuan.close()
    await until(lambda: store.exists(marker_key(str(acme.environment.id), "tuan")))
    await until(lambda: len(b.events("presence.failed")) > failures)
    publish_refused(False)
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    store.close()
    await close_all(linh, probe)


def published_states(instance: Instance, user_id: str) -> list[str]:
    """The states `instance` logged publishing for `user_id`, in order."""
    return [line["state"] for line in instance.events("presence.published") if line["user"] == user_id]


async def test_an_invisible_users_failed_online_is_owed_to_their_own_connections_only(
    live_instances, acme, presence_redis, publish_refused
):
    a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
    store = redis.Redis.from_url(presence_redis.url)
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await tuan.send("presence.set", {"invisible": True})
    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    await tuan.close()
    await until(lambda: store.exists(marker_key(str(acme.environment.id), "tuan")))
    # He comes back invisible: his `online` is for his own connections, and its publish fails.
    publish_refused(True)
    tuan = await connect(b, acme, "tuan")
    await logged(b, "presence.failed", op="publish")
    publish_refused(False)
    # Sent again by the refresh, still to his own connections alone.
    await until(lambda: published_states(b, "tuan").count("online") == 2)
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    store.close()
    await close_all(linh, tuan, probe)


async def test_an_online_owed_to_a_user_who_left_meanwhile_is_dropped(
    live_instances, acme, presence_redis, publish_refused
):
    a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
    store = redis.Redis.from_url(presence_redis.url)
    linh = await connect(a, acme, "linh")
    publish_refused(True)
    tuan = await connect(b, acme, "tuan")
    await logged(b, "presence.failed", op="publish")
    # tuan leaves for good while his `online` is still owed: his `offline` supersedes it.
    await tuan.close()
    await until(lambda: store.exists(marker_key(str(acme.environment.id), "tuan")))
    publish_refused(False)
    await logged(b, "presence.published", user="tuan", state="offline")
    probe = await barrier(a, acme, [linh])
    assert "online" not in states(linh, "tuan")
    store.close()
    await close_all(linh, probe)


async def test_an_old_dump_restored_flaps_no_connected_user(live_instances, acme, presence_redis):
    a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    await heard(linh, "tuan", 1)
    store = redis.Redis.from_url(presence_redis.url, decode_responses=True)
    environment = str(acme.environment.id)
    store.save()
    saved = presence_redis.directory / "dump.rdb"
    old_dump = saved.with_name("old.rdb")
    shutil.copy(saved, old_dump)
    epoch = user_epoch_key(environment, "tuan")
    old_epoch = store.get(epoch)
    # Long enough for every deadline in the dump to be due when it comes back.
    await asyncio.sleep((TTL + GRACE + 2 * REFRESH) / 1000)
    # tuan's instance holds still while Redis goes back in time, so a reaper gets the first look
    # at what came back (as a slow instance would).
    os.kill(b.process.pid, signal.SIGSTOP)
    try:
        presence_redis.stop()
        shutil.copy(old_dump, saved)
        presence_redis.start()
        store = redis.Redis.from_url(presence_redis.url, decode_responses=True)
        # a's reaper has looked at tuan's deadline (deferred it, or decided him gone).
        await until(lambda: store.hget(channels_key(environment, "tuan"), "e") != old_epoch)
    finally:
        os.kill(b.process.pid, signal.SIGCONT)
    await logged(b, "presence.suppressed", user="tuan", reason=VANISHED)
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online"]
    assert store.get(epoch) != old_epoch
    store.close()
    await close_all(linh, tuan, probe)


async def test_a_grace_check_whose_reply_was_lost_still_publishes_the_offline(live_instances, acme, presence_redis):
    # tuan's instance reaches the presence Redis through the fault proxy. Its grace check's
    # script runs, and the reply comes after the store's timeout: the marker was taken, the
    # deadline with it, and nobody has published `offline` yet (the layer does, after the reply).
    proxy = Proxy(presence_redis.port)
    try:
        [a] = live_instances(1, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        [b] = live_instances(1, **timings(RELAY_PRESENCE_REDIS_URL=proxy.url))
        store = redis.Redis.from_url(presence_redis.url)
        # In Redis's script cache, as on any deployment that ran a grace check before: the delayed
        # call is then the script itself, not a NOSCRIPT answer.
        store.script_load(GRACE_CHECK)
        environment = str(acme.environment.id)
        linh = await connect(a, acme, "linh")
        tuan = await connect(b, acme, "tuan")
        assert await heard(linh, "tuan", 1) == ["online"]
        await tuan.close()
        await until(lambda: not store.exists(presence_key(environment, "tuan")))
        # 0.4 s each way: the script reaches Redis within the timeout, its reply after it.
        proxy.command("delay 0.4")
        await logged(b, "presence.failed", op="grace_check")
        await until(lambda: store.exists(marker_key(environment, "tuan")))
        proxy.command("pass")

        assert await heard(linh, "tuan", 2) == ["online", "offline"]
        probe = await barrier(a, acme, [linh])
        assert states(linh, "tuan") == ["online", "offline"]
        store.close()
        await close_all(linh, probe)
    finally:
        proxy.stop()


async def test_a_user_let_in_elsewhere_while_redis_was_silent_is_not_said_offline_by_a_grace_check(
    live_instances, acme, presence_redis
):
    # tuan closes on b and, while presence's Redis is down, connects on a: let in without an
    # election, he has no key until a's next answered refresh. b's grace check fails in the
    # outage and is asked again; it must not take the missing key for his departure.
    a, b = live_instances(
        2, **timings(ttl=6000, grace=1500, refresh=1000, margin=300, RELAY_PRESENCE_REDIS_URL=presence_redis.url)
    )
    linh = await connect(a, acme, "linh")
    tuan = await connect(b, acme, "tuan")
    assert await heard(linh, "tuan", 1) == ["online"]
    await tuan.close()
    presence_redis.stop()
    try:
        back = await connect(a, acme, "tuan")
        await logged(a, "presence.failed", op="admit")
        await logged(b, "presence.failed", op="grace_check")
        os.kill(a.process.pid, signal.SIGSTOP)
    finally:
        presence_redis.start()
    try:
        # a is frozen: only the wait for its refresh keeps b from deciding now.
        offline = {"user": "tuan", "state": "offline"}
        await until(
            lambda: (
                lines([b], "presence.published", **offline)
                or lines([b], "presence.suppressed", **offline, reason=RECOVERING)
            )
        )
    finally:
        os.kill(a.process.pid, signal.SIGCONT)
    await logged(b, "presence.suppressed", **offline, reason=STILL_OPEN)
    probe = await barrier(a, acme, [linh])
    assert lines([b], "presence.published", **offline) == []
    assert "offline" not in states(linh, "tuan") and states(linh, "tuan")[-1] == "online"
    await close_all(linh, back, probe)


async def test_an_online_published_before_a_watchers_instance_subscribed_again_reaches_it(live_instances, acme):
    # Redis restarts empty while linh's instance b is frozen, so b's pub/sub connection is down
    # and cannot come back yet: tuan's `online`, published by his election on a, is not heard
    # there. a's own pub/sub connection had just come back, so a sends it once more a refresh
    # interval later, by when b has subscribed again. linh hears it once.
    server = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_REDIS_URL=server.url))
        await add_user(acme, "mai")
        mai = await connect(a, acme, "mai")  # a has groups, so its pub/sub connection comes back
        linh = await connect(b, acme, "linh")
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            server.stop()
            server.start()
            await logged(a, "layer.reconnected")  # a's pub/sub connection is back, b's is not
            tuan = await connect(a, acme, "tuan")
            await logged(a, "presence.published", user="tuan", state="online")
            assert states(linh, "tuan") == []
        finally:
            os.kill(b.process.pid, signal.SIGCONT)

        assert await heard(linh, "tuan", 1) == ["online"]
        probe = await barrier(b, acme, [linh])
        assert states(linh, "tuan") == ["online"]
        await close_all(linh, tuan, mai, probe)
    finally:
        server.close()
