"""Presence under real operations: a dead instance's users reaped at scale and in order, Redis
losing its data, a failed grace check, a refused replacement.

Real Daphne processes on a real Redis. A dead instance is played by a PresenceStore in this
process that admits users (the same ADMIT script an instance runs) and then never refreshes
them, as a SIGKILLed instance would not: its users' keys expire and their deadlines fall due.
"""

import asyncio
import os
import signal
import time
import uuid
from datetime import datetime

import pytest
import redis
from channels.db import database_sync_to_async

from devtools.embedded_redis import EmbeddedRedis
from presence import actions
from presence.scripts import connections_key, marker_key, presence_key
from presence.store import PresenceStore, Timings
from relay.models import Membership, User
from tests.support import (
    CHECK,
    GRACE,
    MARGIN,
    REFRESH,
    TTL,
    WAIT,
    Tenant,
    WsClient,
    add_channel,
    barrier,
    close_all,
    connect,
    heard,
    http,
    lines,
    logged,
    states,
    timings,
    until,
)

pytestmark = pytest.mark.live


@database_sync_to_async
def add_users(tenant: Tenant, prefix: str, count: int, channel: str) -> list[str]:
    """`count` users of `tenant`, members of `channel` (by name), in two statements."""
    users = User.objects.bulk_create(
        [User(environment=tenant.environment, external_id=f"{prefix}-{i:05d}") for i in range(count)]
    )
    Membership.objects.bulk_create([Membership(channel=tenant.channels[channel], user=user) for user in users])
    return [user.external_id for user in users]


async def held_by_a_dead_instance(
    redis_url: str, tenant: Tenant, user_ids: list[str], channel: str, ttl: int, grace: int, refresh: int
) -> None:
    """Admit every user as an instance would, then never refresh them: that instance died."""
    store = PresenceStore(redis_url, Timings(grace=grace, ttl=ttl, refresh=refresh, margin=MARGIN, max_connections=5))
    environment_id = str(tenant.environment.id)
    channel_ids = [str(tenant.channels[channel].id)]
    # Above the environment's large_room_members when it holds thousands: counted, as an instance would.
    large = channel_ids if len(user_ids) > tenant.environment.large_room_members else []
    elections = []
    try:
        # A few hundred connects at a time, as they reach an instance: a thousand at once could
        # outwait the store's socket timeout on a busy machine.
        for start in range(0, len(user_ids), 250):
            elections += await asyncio.gather(
                *(
                    store.elect(environment_id, user_id, uuid.uuid4().hex, channels=channel_ids, large=large)
                    for user_id in user_ids[start : start + 250]
                )
            )
        assert all(election is not None and election.won for election in elections)
    finally:
        await store.close()


def offline_heard(watcher, user_ids: list[str]) -> int:
    wanted = set(user_ids)
    return sum(1 for change in watcher.changes() if change["state"] == "offline" and change["user"] in wanted)


async def test_the_reapers_offline_never_lands_after_a_reconnects_online(
    live_instances, acme, redis_url, redis_client, closing
):
    a, b = live_instances(2, **timings())
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    users = await add_users(acme, "gone", 300, "general")
    await held_by_a_dead_instance(redis_url, acme, users, "general", TTL, GRACE, REFRESH)
    # The moment the reaper's first script has decided, ten of the users it decided come back on a
    # surviving instance, racing the delivery of their `offline`. (Users whose deadline fell after
    # that script are left out: coming back before their offline is decided, they rightly get none.)
    environment_id = str(acme.environment.id)
    first = marker_key(environment_id, users[0])
    await until(lambda: redis_client.exists(first), timeout=(TTL + GRACE) / 1000 + WAIT, interval=0.002)
    with redis_client.pipeline(transaction=False) as pipe:
        for user_id in users:
            pipe.exists(marker_key(environment_id, user_id))
        decided = [user_id for user_id, exists in zip(users, pipe.execute(), strict=True) if exists]
    # Never users[0] (decided[0]), whose last word below must stay its `offline`.
    back = decided[1:][-10:]
    assert back
    returned = await asyncio.gather(*(connect(a, acme, user_id) for user_id in back))
    for watcher in (linh, tuan):
        await watcher.wait_for(lambda w: offline_heard(w, users) == len(users))
        await watcher.wait_for(lambda w: all(states(w, user_id)[-1:] == ["online"] for user_id in back))
    # A reaper pass later, nothing more: the last word on each returned user is their `online`.
    await asyncio.sleep(2 * REFRESH / 1000)
    probe = await barrier(a, acme, [linh, tuan])
    for watcher in (linh, tuan):
        for user_id in back:
            assert states(watcher, user_id) == ["offline", "online"]
        assert states(watcher, users[0]) == ["offline"]
    await close_all(linh, tuan, probe, *returned)


@pytest.mark.solo
async def test_a_dead_instances_ten_thousand_users_are_reaped_by_two_survivors_in_time(
    live_instances, acme, redis_url, closing
):
    ttl, grace, refresh = 2000, 1000, 500
    a, b = live_instances(2, **timings(grace=grace, ttl=ttl, refresh=refresh))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    # Not in the database at all: the reaper publishes to the channels kept beside each deadline.
    users = [f"ghost-{i:05d}" for i in range(10_000)]
    before = {id(watcher): len(watcher.frames) for watcher in (linh, tuan)}
    await held_by_a_dead_instance(redis_url, acme, users, "general", ttl, grace, refresh)
    died = time.time()
    bound = (ttl + grace + 2 * refresh) / 1000
    for watcher in (linh, tuan):
        # Cheap to ask on every frame: the watchers hear nothing else meanwhile (checked below).
        await watcher.wait_for(lambda w: len(w.frames) >= before[id(w)] + len(users), bound + WAIT)
        assert offline_heard(watcher, users) == len(users)
    # Every one of them announced (published) within TTL + grace + 2 x refresh of the death.
    # (A frame can overtake the log line written after its publish.)
    await until(lambda: len(lines([a, b], "presence.published", state="offline")) >= len(users))
    published = lines([a, b], "presence.published", state="offline")
    last = max(datetime.fromisoformat(line["time"]).timestamp() for line in published)
    assert last - died <= bound
    # Both survivors reaped (each REAP script takes a batch), one `offline` per user in all.
    assert len(published) == len(users)
    assert {line["user"] for line in published} == set(users)
    # The survivors' own users were refreshed throughout: never found vanished, never offline.
    assert lines([a, b], "presence.suppressed", reason=actions.VANISHED) == []
    probe = await barrier(a, acme, [linh, tuan])
    assert states(linh, "tuan") == ["online"]
    assert "linh" in tuan.of_type("presence.snapshot")[0]["online"] and states(tuan, "linh") == []
    await close_all(linh, tuan, probe)


async def test_a_grace_check_that_failed_is_asked_again(live_instances, acme, closing):
    presence_redis = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        linh = await closing(connect(a, acme, "linh"))
        tuan = await closing(connect(b, acme, "tuan"))
        assert await heard(linh, "tuan", 1) == ["online"]
        key = presence_key(str(acme.environment.id), "tuan")
        client = redis.Redis.from_url(presence_redis.url)
        await tuan.close()
        # The close's re-pin is done; then Redis goes away until tuan's grace check has failed.
        await until(lambda: 0 < client.pttl(key) <= GRACE)
        client.close()
        presence_redis.stop()
        await logged(b, "presence.failed", op="grace_check")
        presence_redis.start()  # empty: the deadline went too, so no reaper would say it
        assert await heard(linh, "tuan", 2, timeout=CHECK / 1000 + WAIT) == ["online", "offline"]
        await logged(b, "presence.published", user="tuan", state="offline")
        probe = await barrier(a, acme, [linh])
        assert states(linh, "tuan") == ["online", "offline"]
        await close_all(linh, probe)
    finally:
        presence_redis.close()


async def test_a_refused_replacement_keeps_the_last_closes_re_pin_and_grace_check(
    live_instances, acme, redis_client, closing
):
    # A TTL and refresh far beyond the test: `offline` in time can only come from the grace check
    # (the reaper would take TTL + grace), and no refresh runs while Redis is paused.
    ttl = 12_000
    (a,) = live_instances(1, **timings(ttl=ttl, refresh=5000, RELAY_MAX_CONNECTIONS_PER_USER=1))
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(a, acme, "tuan"))
    assert await heard(linh, "tuan", 1) == ["online"]
    # Writes held back: the replacement's election waits in Redis, and the close of the
    # connection it replaces runs meanwhile on the instance.
    redis_client.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
    try:
        opening = asyncio.ensure_future(WsClient.open(a.ws_url(acme.token("tuan"))))
        await until(lambda: any(c["cmd"] == "evalsha" and "b" in c["flags"] for c in redis_client.client_list()))
        await tuan.close()
        await asyncio.sleep(0.1)
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
    replacement = await opening
    # Redis saw the replacement first, while the closing connection still held the one slot.
    assert await replacement.closed() == 4429
    assert await heard(linh, "tuan", 2, timeout=CHECK / 1000 + 2) == ["online", "offline"]
    assert not redis_client.exists(presence_key(str(acme.environment.id), "tuan"))
    probe = await barrier(a, acme, [linh])
    assert states(linh, "tuan") == ["online", "offline"]
    await close_all(linh, probe)


async def test_redis_losing_its_data_before_a_grace_check_makes_no_flap(live_instances, acme, closing):
    presence_redis = EmbeddedRedis().start()
    try:
        # A refresh interval far longer than the check's delay: b's check comes before a's next
        # refresh has re-elected tuan's key in the emptied Redis.
        grace, refresh = 600, 2000
        a, b = live_instances(
            2, **timings(grace=grace, ttl=6000, refresh=refresh, RELAY_PRESENCE_REDIS_URL=presence_redis.url)
        )
        linh = await closing(connect(a, acme, "linh"))
        on_a = await closing(connect(a, acme, "tuan"))
        on_b = await closing(connect(b, acme, "tuan"))
        assert await heard(linh, "tuan", 1) == ["online"]
        client = redis.Redis.from_url(presence_redis.url)
        conns = connections_key(str(acme.environment.id), "tuan")
        held_on_a = on_a.of_type("connection.ack")[0]["connection_id"]
        score = client.zscore(conns, held_on_a)
        # Right after a's refresh (it rewrites its connection's expiry), tuan leaves b and the
        # presence Redis restarts empty.
        await until(lambda: client.zscore(conns, held_on_a) != score, timeout=refresh / 1000 + WAIT)
        client.close()
        await on_b.close()
        presence_redis.stop()
        presence_redis.start()
        await logged(b, "presence.suppressed", user="tuan", reason=actions.EPOCH_CHANGED)
        await logged(b, "presence.suppressed", user="tuan", reason=actions.STILL_OPEN, timeout=refresh / 1000 + WAIT)
        probe = await barrier(a, acme, [linh])
        assert states(linh, "tuan") == ["online"]
        assert lines([a, b], "presence.published", user="tuan", state="offline") == []
        # When he really leaves, it is said once.
        await on_a.close()
        assert await heard(linh, "tuan", 2, timeout=(grace + MARGIN) / 1000 + WAIT) == ["online", "offline"]
        await close_all(linh, probe)
    finally:
        presence_redis.close()


async def test_the_reapers_offline_skips_a_channel_the_user_left_just_before_their_instance_died(
    live_instances, acme, closing
):
    # hermit shares only "huddle" with tuan. tuan is removed from it while his instance is frozen
    # (it neither applies the removal nor refreshes the channels kept beside his deadline), then
    # the instance dies: the reaper's `offline` goes to fleet and general, not to huddle.
    a, b = live_instances(2, **timings())
    huddle = await add_channel(acme, "huddle", "private", ("tuan", "hermit"))
    linh = await closing(connect(a, acme, "linh"))
    hermit = await closing(connect(a, acme, "hermit"))
    tuan = await closing(connect(b, acme, "tuan"))
    assert await heard(linh, "tuan", 1) == ["online"]
    assert await heard(hermit, "tuan", 1) == ["online"]
    os.kill(b.process.pid, signal.SIGSTOP)
    try:
        assert http("DELETE", f"{a.http_url}/v1/channels/{huddle.id}/members/tuan", api_key=acme.api_key)[0] == 204
    finally:
        b.kill()

    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    probe = await barrier(a, acme, [hermit], channel="huddle")
    assert states(hermit, "tuan") == ["online"]
    await close_all(linh, hermit, probe, tuan)


async def test_a_channel_added_while_a_grace_check_decides_hears_the_offline(
    live_instances, acme, redis_client, closing
):
    # b's grace check of tuan reads his channels, then waits (tests/hesitant) while tuan, still
    # connected on a, is added to "huddle" and announced there to hermit, who shares nothing
    # else with him. Then tuan leaves a too, his key expires, and b's check decides with the
    # channels it read before the addition. a's own check comes a margin after the key expired,
    # long beside the steps below (so b's decides), and finds b's marker; the reaper comes later
    # still (a TTL as long).
    held = timings(ttl=3000, margin=3000)
    [a] = live_instances(1, **held)
    [b] = live_instances(1, **held, DJANGO_SETTINGS_MODULE="tests.hesitant_settings")
    huddle = await add_channel(acme, "huddle", "private", ("hermit",))
    linh = await closing(connect(a, acme, "linh"))
    hermit = await closing(connect(a, acme, "hermit"))
    on_a = await closing(connect(a, acme, "tuan"))
    on_b = await closing(connect(b, acme, "tuan"))
    assert await heard(linh, "tuan", 1) == ["online"]
    await on_b.close()
    await logged(b, "test.check_held")
    assert http("PUT", f"{a.http_url}/v1/channels/{huddle.id}/members/tuan", api_key=acme.api_key)[0] == 201
    assert await heard(hermit, "tuan", 1) == ["online"]
    await on_a.close()
    await until(lambda: not redis_client.exists(presence_key(str(acme.environment.id), "tuan")))
    b.process.send_signal(signal.SIGUSR1)

    assert await heard(linh, "tuan", 2) == ["online", "offline"]
    assert await heard(hermit, "tuan", 2) == ["online", "offline"]
    await logged(b, "presence.published", user="tuan", state="offline")
    await logged(a, "presence.suppressed", user="tuan", state="offline", reason=actions.ANOTHER_PUBLISHED)
    probes = [await barrier(a, acme, [linh]), await barrier(a, acme, [hermit], channel="huddle")]
    assert states(linh, "tuan") == ["online", "offline"]
    assert states(hermit, "tuan") == ["online", "offline"]
    await close_all(linh, hermit, *probes)
