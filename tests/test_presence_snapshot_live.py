"""A snapshot says what watchers were last told, also while a departure is still undecided.

A user's presence key can be gone before anyone has decided they left: a close re-pins the key
to the grace and the grace check runs a margin later; a dead instance's key expires after the
TTL and the reaper decides a grace later. A user who comes back in that window publishes nothing
(watchers last heard `online`), so a watcher who connected in it must have had them in its
snapshot, or "snapshot + changes ends with the true state" (docs/contract.md) fails for good.
The same holds of a snapshot read in a Redis that has just lost its data, before the users'
holders re-elected them.

The cast (tests/conftest.py): in acme, linh and tuan share "fleet" and "general"; linh watches.
"""

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis
from presence import actions
from presence.scripts import channel_online_key
from presence.store import presence_key
from tests.support import (
    TTL,
    Instance,
    add_channel,
    add_user,
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


def view(client) -> set[str]:
    """The client's idea of who is online: its snapshot, then every change in order."""
    online = set(client.of_type("presence.snapshot")[0]["online"])
    for change in client.changes():
        (online.add if change["state"] == "online" else online.discard)(change["user"])
    return online


@contextlib.asynccontextmanager
async def frozen_through_an_empty_restart(
    server: EmbeddedRedis, a: Instance, b: Instance, on_a: str, on_b: str, noticed: bool = True
) -> AsyncIterator[None]:
    """b frozen while Redis restarts empty: the body runs once a's refresh has reached the new
    Redis (it re-elected `on_a`, in silence), or at once, before it has (not `noticed`: a's
    refresh every 2 s leaves time); after it, b thaws and its refresh re-elects `on_b`."""
    os.kill(b.process.pid, signal.SIGSTOP)
    try:
        server.stop()
        server.start()
        if noticed:
            await logged(a, "presence.suppressed", user=on_a, reason=actions.VANISHED)
        yield
        if not noticed:
            await logged(a, "presence.suppressed", user=on_a, reason=actions.VANISHED)
    finally:
        os.kill(b.process.pid, signal.SIGCONT)
    await logged(b, "presence.suppressed", user=on_b, reason=actions.VANISHED)


async def sees_tuan_back_unannounced(gateway, acme) -> None:
    """linh connects, then tuan comes back before his departure was decided: linh's snapshot
    lists him, and his return publishes nothing (his `online` was never retracted)."""
    linh = await connect(gateway, acme, "linh")
    back = await connect(gateway, acme, "tuan")
    await logged(gateway, "presence.suppressed", user="tuan", state="online", reason=actions.NEVER_RETRACTED)
    probe = await barrier(gateway, acme, [linh])

    assert "tuan" in linh.of_type("presence.snapshot")[0]["online"]
    assert "tuan" in view(linh)
    assert linh.changes("tuan") == []
    await close_all(linh, back, probe)


async def test_a_watcher_connecting_between_the_grace_and_its_check_sees_a_user_who_returns(
    live_instances, acme, redis_client
):
    # A margin far longer than the steps below holds the window open: the key dies at the grace,
    # the check runs at grace + margin.
    [gateway] = live_instances(1, **timings(grace=300, margin=8000))
    tuan = await connect(gateway, acme, "tuan")
    await tuan.close()
    await until(lambda: not redis_client.exists(presence_key(str(acme.environment.id), "tuan")))

    await sees_tuan_back_unannounced(gateway, acme)


async def test_a_user_added_to_a_channel_between_their_grace_and_its_check_is_announced_as_they_return(
    live_instances, acme, redis_client
):
    # tuan's key dies at the grace, his check runs at grace + margin (found by the chaos checker:
    # a reconnect 70 ms after the grace). Added meanwhile to mai's channel, he is found offline;
    # his return takes over an `online` never retracted and publishes nothing. mai must hear him.
    [gateway] = live_instances(1, **timings(grace=300, margin=8000))
    await add_user(acme, "mai")
    ops = await add_channel(acme, "ops", "public", ("mai",))
    mai = await connect(gateway, acme, "mai")
    linh = await connect(gateway, acme, "linh")
    tuan = await connect(gateway, acme, "tuan")
    assert await heard(linh, "tuan", 1) == ["online"]
    await tuan.close()
    await until(lambda: not redis_client.exists(presence_key(str(acme.environment.id), "tuan")))
    status, _ = http("PUT", f"{gateway.http_url}/v1/channels/{ops.id}/members/tuan", api_key=acme.api_key)
    assert status == 201
    assert "tuan" not in view(mai)

    back = await connect(gateway, acme, "tuan")
    await logged(gateway, "presence.suppressed", user="tuan", state="online", reason=actions.NEVER_RETRACTED)
    await mai.wait_for(lambda client: "tuan" in view(client))
    probe = await barrier(gateway, acme, [mai], channel="ops")
    assert mai.changes("tuan") == [{"user": "tuan", "state": "online"}]
    # linh shared fleet and general with him all along: the `online` she heard stands, and she
    # hears no second one.
    fleet_probe = await barrier(gateway, acme, [linh])
    assert linh.changes("tuan") == [{"user": "tuan", "state": "online"}]
    await close_all(mai, linh, back, probe, fleet_probe)


async def test_a_watcher_connecting_after_a_dead_instances_key_expired_sees_a_user_who_returns(
    live_instances, acme, redis_client
):
    # A grace long enough that both connects land before the reaper decides (last refresh + TTL + grace).
    a, b = live_instances(2, **timings(grace=8000))
    tuan = await connect(b, acme, "tuan")
    b.kill()
    await until(lambda: not redis_client.exists(presence_key(str(acme.environment.id), "tuan")))

    linh = await connect(a, acme, "linh")
    back = await connect(a, acme, "tuan")
    await logged(a, "presence.suppressed", user="tuan", state="online", reason=actions.NEVER_RETRACTED)
    probe = await barrier(a, acme, [linh])

    assert "tuan" in view(linh)
    assert linh.changes("tuan") == []
    await close_all(linh, back, probe, tuan)


async def test_a_dead_instances_user_leaves_the_snapshot_once_the_reaper_says_offline(live_instances, acme):
    # A dead instance's users stay in their channels' online sets past the reaper's decision
    # (a margin long beside it keeps their entries well after it); the reaper's instance takes
    # them out right after deciding, before any later election of its own reads the sets.
    a, b = live_instances(2, **timings(margin=2000))
    await add_user(acme, "mai", ("fleet",))
    tuan = await connect(b, acme, "tuan")
    linh = await connect(a, acme, "linh")
    b.kill()
    assert await heard(linh, "tuan", 1) == ["offline"]

    mai = await connect(a, acme, "mai")

    assert mai.of_type("presence.snapshot")[0]["online"] == ["linh", "mai"]
    await close_all(linh, mai, tuan)


async def test_a_member_added_between_the_grace_and_its_check_is_told_of_a_user_who_returns(
    live_instances, acme, redis_client
):
    # The same window, reached through a membership: hermit joins a channel of tuan's while tuan's
    # departure is undecided, then tuan returns and publishes nothing.
    [gateway] = live_instances(1, **timings(grace=300, margin=8000))
    await add_channel(acme, "huddle", "private", ("tuan",))
    hermit = await connect(gateway, acme, "hermit")
    tuan = await connect(gateway, acme, "tuan")
    await tuan.close()
    await until(lambda: not redis_client.exists(presence_key(str(acme.environment.id), "tuan")))

    channel = acme.channels["huddle"].id
    assert http("PUT", f"{gateway.http_url}/v1/channels/{channel}/members/hermit", api_key=acme.api_key)[0] == 201
    back = await connect(gateway, acme, "tuan")
    await logged(gateway, "presence.suppressed", user="tuan", state="online", reason=actions.NEVER_RETRACTED)
    probe = await barrier(gateway, acme, [hermit], channel="huddle")

    assert "tuan" in view(hermit)
    await close_all(hermit, back, probe)


async def test_a_watcher_that_connected_while_presence_redis_was_down_learns_who_is_online_once_it_returns(
    live_instances, acme
):
    # docs/contract.md, "Fair under load and faults": after an outage every watcher's view equals
    # the truth. linh's snapshot could not be read; tuan stays connected throughout, so no
    # transition of his would ever tell her.
    presence_redis = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        tuan = await connect(b, acme, "tuan")
        presence_redis.stop()
        linh = await connect(a, acme, "linh")
        await logged(a, "presence.failed", op="admit")
        assert linh.of_type("presence.snapshot") == [{"online": [], "status": {}}]

        presence_redis.start()
        await linh.wait_for(lambda client: "tuan" in view(client))

        assert linh.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(linh, tuan)
    finally:
        presence_redis.close()


async def test_a_watcher_whose_snapshot_redis_did_not_answer_learns_of_a_co_member_re_elected_in_silence(
    live_instances, acme
):
    # Redis is down as linh connects (her snapshot goes out empty) and comes back empty. tuan stays
    # connected throughout: his instance, frozen for a refresh interval after a's first answer,
    # re-elects his key in silence only then. linh's repair must read after every live holder
    # re-elected its users, not at a's own refreshes.
    server = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(ttl=3000, refresh=1000, margin=1500, RELAY_REDIS_URL=server.url))
        tuan = await connect(b, acme, "tuan")
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            server.stop()
            linh = await connect(a, acme, "linh")
            assert linh.of_type("presence.snapshot") == [{"online": [], "status": {}}]
            server.start()
            # a's refresh got the emptied Redis's answer (it re-elected linh).
            await logged(a, "presence.suppressed", user="linh", reason=actions.VANISHED)
            await asyncio.sleep(1.2)
        finally:
            os.kill(b.process.pid, signal.SIGCONT)
        await logged(b, "presence.suppressed", user="tuan", reason=actions.VANISHED)

        await linh.wait_for(lambda client: "tuan" in view(client))
        assert linh.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(linh, tuan)
    finally:
        server.close()


async def test_a_watchers_repair_read_just_after_redis_restarted_empty_again_is_made_again(live_instances, acme):
    # linh's snapshot goes out empty (Redis is down as she connects); her repair reads
    # `Timings.rejoin` after a's first answer. Just before it does, Redis restarts empty again
    # while tuan's instance is frozen: the read misses him, and his re-election once b thaws is
    # silent. The repair must be made again once the holders have re-elected.
    server = EmbeddedRedis().start()
    refresh, margin = 500, 1500
    try:
        a, b = live_instances(2, **timings(ttl=3000, refresh=refresh, margin=margin, RELAY_REDIS_URL=server.url))
        tuan = await connect(b, acme, "tuan")
        # Older than the margin when b's layer loses Redis: b sends his `online` no second time.
        await asyncio.sleep(margin / 1000)
        server.stop()
        linh = await connect(a, acme, "linh")
        assert linh.of_type("presence.snapshot") == [{"online": [], "status": {}}]
        server.start()
        await logged(a, "presence.suppressed", user="linh", reason=actions.VANISHED)
        repair_reads_at = time.monotonic() + (2 * refresh + margin) / 1000
        await logged(b, "presence.suppressed", user="tuan", reason=actions.VANISHED)
        await asyncio.sleep(repair_reads_at - 0.3 - time.monotonic())
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            server.stop()
            server.start()
            await asyncio.sleep(0.8)
        finally:
            os.kill(b.process.pid, signal.SIGCONT)
        assert "tuan" not in view(linh)

        await linh.wait_for(lambda client: "tuan" in view(client))
        probe = await barrier(a, acme, [linh])
        assert linh.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(linh, tuan, probe)
    finally:
        server.close()


async def watcher_connecting_before_the_loss_is_noticed_learns_who_stayed(live_instances, acme, restarts: int) -> None:
    """linh connects to a right after Redis restarted empty, before a's refresh (every 2 s) has
    found hermit's key gone; tuan's instance is frozen, so his key is not back and her snapshot
    misses him. Redis restarts `restarts` times in all, each noticed by a. Then tuan's holder
    re-elects him in silence: she must still be told."""
    server = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(ttl=6000, refresh=2000, margin=500, RELAY_REDIS_URL=server.url))
        tuan = await connect(b, acme, "tuan")
        hermit = await connect(a, acme, "hermit")
        os.kill(b.process.pid, signal.SIGSTOP)
        try:
            server.stop()
            server.start()
            linh = await connect(a, acme, "linh")
            assert "tuan" not in linh.of_type("presence.snapshot")[0]["online"]
            await logged(a, "presence.suppressed", user="hermit", reason=actions.VANISHED)
            for noticed in range(2, restarts + 1):
                server.stop()
                server.start()
                await until(
                    lambda noticed=noticed: (
                        len(lines([a], "presence.suppressed", user="hermit", reason=actions.VANISHED)) == noticed
                    )
                )
        finally:
            os.kill(b.process.pid, signal.SIGCONT)
        await logged(b, "presence.suppressed", user="tuan", reason=actions.VANISHED)

        await linh.wait_for(lambda client: "tuan" in view(client))
        assert linh.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await logged(a, "presence.repaired", connection_id=linh.of_type("connection.ack")[0]["connection_id"])
        await close_all(linh, tuan, hermit)
    finally:
        server.close()


async def test_a_watcher_connecting_after_redis_restarted_empty_but_before_its_instance_noticed_learns_who_stayed(
    live_instances, acme
):
    await watcher_connecting_before_the_loss_is_noticed_learns_who_stayed(live_instances, acme, restarts=1)


async def test_a_watcher_connecting_between_two_empty_restarts_of_redis_learns_who_stayed(live_instances, acme):
    # Redis restarts empty once more before linh's view is checked (found by the chaos checker:
    # restarts 5 s apart). Her read is of the first loss, though the second has moved her
    # bucket's epoch on since.
    await watcher_connecting_before_the_loss_is_noticed_learns_who_stayed(live_instances, acme, restarts=2)


async def test_a_watcher_closing_before_redis_answers_leaves_the_other_watchers_repairs_owed(live_instances, acme):
    # linh connects twice while Redis is down: both snapshots go out empty and both connections
    # wait for Redis to answer before their repair. One closes meanwhile. The other must still be
    # told who stayed online, as a lone watcher is.
    server = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_REDIS_URL=server.url))
        tuan = await connect(b, acme, "tuan")
        server.stop()
        linh = await connect(a, acme, "linh")
        leaving = await connect(a, acme, "linh")
        for client in (linh, leaving):
            assert client.of_type("presence.snapshot") == [{"online": [], "status": {}}]
        await leaving.close()
        await logged(a, "connection.closed", connection_id=leaving.of_type("connection.ack")[0]["connection_id"])
        server.start()

        await linh.wait_for(lambda client: "tuan" in view(client))
        assert linh.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await logged(a, "presence.repaired", connection_id=linh.of_type("connection.ack")[0]["connection_id"])
        await close_all(linh, tuan)
    finally:
        server.close()


# a's refresh has found out Redis restarted empty before the membership change, or not yet.
AROUND_THE_NOTICE = pytest.mark.parametrize(
    "noticed, tuned",
    [(True, {"ttl": 3000, "refresh": 1000, "margin": 1500}), (False, {"ttl": 6000, "refresh": 2000, "margin": 500})],
    ids=["after_it_was_noticed", "before_it_was_noticed"],
)


@AROUND_THE_NOTICE
async def test_a_user_added_right_after_redis_restarted_empty_is_announced_once_their_holder_re_elects_them(
    live_instances, acme, noticed, tuned
):
    # tuan stays connected on b, frozen while Redis restarts empty and while he is added to mai's
    # channel: his key is not back yet, so the addition finds him offline. His holder's refresh
    # then re-elects him in silence; mai, who shared no channel with him, must still hear it.
    server = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(**tuned, RELAY_REDIS_URL=server.url))
        await add_user(acme, "mai")
        ops = await add_channel(acme, "ops", "public", ("mai",))
        tuan = await connect(b, acme, "tuan")
        mai = await connect(a, acme, "mai")
        async with frozen_through_an_empty_restart(server, a, b, "mai", "tuan", noticed):
            status, _ = http("PUT", f"{a.http_url}/v1/channels/{ops.id}/members/tuan", api_key=acme.api_key)
            assert status == 201
            assert "tuan" not in view(mai)

        await mai.wait_for(lambda client: "tuan" in view(client))
        await logged(a, "presence.announced", user="tuan")
        probe = await barrier(a, acme, [mai], channel="ops")
        assert mai.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(mai, tuan, probe)
    finally:
        server.close()


async def test_a_user_added_right_after_redis_restarted_empty_is_announced_by_their_holder_if_the_api_instance_dies(
    live_instances, acme
):
    # As above, but the instance that served the addition dies before it could ask again: tuan's
    # own instance, which applies the change to his connection, announces him once it has
    # re-elected him, under the membership's announcement id.
    server = EmbeddedRedis().start()
    try:
        a, b, c = live_instances(3, **timings(ttl=3000, refresh=1000, margin=1500, RELAY_REDIS_URL=server.url))
        await add_user(acme, "mai")
        ops = await add_channel(acme, "ops", "public", ("mai",))
        tuan = await connect(b, acme, "tuan")
        mai = await connect(a, acme, "mai")
        async with frozen_through_an_empty_restart(server, a, b, "mai", "tuan"):
            status, _ = http("PUT", f"{c.http_url}/v1/channels/{ops.id}/members/tuan", api_key=acme.api_key)
            assert status == 201
            c.process.kill()
            assert "tuan" not in view(mai)

        await mai.wait_for(lambda client: "tuan" in view(client))
        await logged(b, "presence.announced", user="tuan")
        probe = await barrier(a, acme, [mai], channel="ops")
        assert mai.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(mai, tuan, probe)
    finally:
        server.close()


async def mai_joins_tuans_channel_through_an_empty_restart(
    live_instances, acme, noticed: bool, tuned: dict, tuan_then_joins_hall: bool = False
) -> None:
    """mai joins tuan's "ops" while b, tuan's instance, is frozen through an empty restart (and
    tuan then joins "hall", where mai already is); she must hear him `online` once."""
    server = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(**tuned, RELAY_REDIS_URL=server.url))
        await add_user(acme, "mai")
        hall = await add_channel(acme, "hall", "public", ("mai",))
        ops = await add_channel(acme, "ops", "public", ("tuan",))
        tuan = await connect(b, acme, "tuan")
        mai = await connect(a, acme, "mai")
        async with frozen_through_an_empty_restart(server, a, b, "mai", "tuan", noticed):
            status, _ = http("PUT", f"{a.http_url}/v1/channels/{ops.id}/members/mai", api_key=acme.api_key)
            assert status == 201
            # Acknowledged in "ops": mai's connection has applied the change (and read who it showed).
            sent = await mai.send_and_ack({"idem_key": "joined", "channel": str(ops.id), "text": "hi"})
            assert sent["type"] == "message.ack"
            if tuan_then_joins_hall:
                status, _ = http("PUT", f"{a.http_url}/v1/channels/{hall.id}/members/tuan", api_key=acme.api_key)
                assert status == 201
            assert "tuan" not in view(mai)

        await mai.wait_for(lambda client: "tuan" in view(client))
        probe = await barrier(a, acme, [mai], channel="ops")
        assert mai.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(mai, tuan, probe)
    finally:
        server.close()


@AROUND_THE_NOTICE
async def test_a_user_added_to_a_channel_right_after_redis_restarted_empty_is_told_who_it_made_visible(
    live_instances, acme, noticed, tuned
):
    # mai joins tuan's channel right after Redis restarted empty, while tuan's instance is frozen:
    # his key is not back when mai's instance would read who the channel made visible, and his
    # re-election is silent. mai's connection must still hear him.
    await mai_joins_tuans_channel_through_an_empty_restart(live_instances, acme, noticed, tuned)


@AROUND_THE_NOTICE
async def test_a_user_added_after_redis_restarted_empty_hears_a_co_member_since_added_to_another_of_their_channels(
    live_instances, acme, noticed, tuned
):
    # mai joins tuan's "ops" while his key is not back, then tuan joins "hall", where mai already
    # is. "ops" made the pair visible first, so the "hall" addition tells mai nothing; the read
    # for "ops", which waits for tuan's holder to re-elect him, must not count "hall" against him.
    await mai_joins_tuans_channel_through_an_empty_restart(
        live_instances, acme, noticed, tuned, tuan_then_joins_hall=True
    )


async def test_a_co_member_a_watcher_heard_come_online_before_its_repair_is_not_told_again(live_instances, acme):
    # linh's snapshot could not be read; tuan connects once Redis is back, before linh's repair
    # runs: she hears his `online` from the transition, and the repair, which tells her who is
    # online, must not tell her again.
    presence_redis = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        presence_redis.stop()
        linh = await connect(a, acme, "linh")
        assert linh.of_type("presence.snapshot") == [{"online": [], "status": {}}]
        presence_redis.start()
        tuan = await connect(b, acme, "tuan")
        assert await heard(linh, "tuan", 1) == ["online"]

        [repaired] = await logged(
            a, "presence.repaired", connection_id=linh.of_type("connection.ack")[0]["connection_id"]
        )
        probe = await barrier(a, acme, [linh])
        # Both were told by transitions: his, and hers, published as Redis came back.
        assert repaired["told"] == 0
        assert linh.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(linh, tuan, probe)
    finally:
        presence_redis.close()


async def test_a_close_right_after_redis_restarted_empty_waits_for_the_users_other_holder_to_re_elect_them(
    live_instances, acme
):
    # tuan is connected on a and on b. Redis restarts empty while b is frozen, and tuan closes his
    # connection on a: his key is gone until b's refresh re-elects it. a's grace check, due before
    # then, must wait for every holder to have re-elected instead of deciding `offline`.
    server = EmbeddedRedis().start()
    settings = timings(grace=300, ttl=4000, refresh=1500, margin=1500, RELAY_REDIS_URL=server.url)
    try:
        a, b = live_instances(2, **settings)
        linh = await connect(a, acme, "linh")
        here = await connect(a, acme, "tuan")
        there = await connect(b, acme, "tuan")
        assert await heard(linh, "tuan", 1) == ["online"]
        async with frozen_through_an_empty_restart(server, a, b, "linh", "tuan"):
            await here.close()
            # The check came due with b still frozen, and was put off.
            await logged(a, "presence.suppressed", user="tuan", reason=actions.SETTLING)

        await logged(a, "presence.suppressed", user="tuan", state="offline", reason=actions.STILL_OPEN)
        probe = await barrier(a, acme, [linh])
        assert states(linh, "tuan") == ["online"]
        await close_all(linh, there, probe)
    finally:
        server.close()


async def test_a_member_added_while_presence_redis_was_down_learns_who_the_channel_shows_once_it_returns(
    live_instances, acme
):
    # hermit joins "fleet" through the API while the presence Redis is away: the membership's notice
    # travels (the channel layer is up), but who is online there could not be read.
    presence_redis = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        tuan = await connect(b, acme, "tuan")
        hermit = await connect(a, acme, "hermit")
        presence_redis.stop()
        fleet = acme.channels["fleet"].id
        assert http("PUT", f"{a.http_url}/v1/channels/{fleet}/members/hermit", api_key=acme.api_key)[0] == 201
        await logged(a, "presence.failed", op="snapshot")

        presence_redis.start()
        await hermit.wait_for(lambda client: "tuan" in view(client))

        assert hermit.changes("tuan") == [{"user": "tuan", "state": "online"}]
        await close_all(hermit, tuan)
    finally:
        presence_redis.close()


async def test_a_watcher_connecting_after_a_close_whose_release_timed_out_sees_a_user_who_returns(live_instances, acme):
    # The close's release times out: the presence Redis pauses writes for 0.75 s, longer than the
    # store's 0.5 s timeout; the pin of tuan's channel entries, sent as the release fails, waits
    # out the rest of the pause and lands. The
    # grace check, which the timeout left without an epoch, decides a refresh interval later than
    # usual; a grace far longer than the steps below holds the window open.
    presence_redis = EmbeddedRedis().start()
    try:
        [gateway] = live_instances(1, **timings(grace=8000, RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        client = redis.Redis.from_url(presence_redis.url, decode_responses=True)
        fleet_set = channel_online_key(str(acme.channels["fleet"].id))
        tuan = await connect(gateway, acme, "tuan")
        client.client_pause(750, all=False)
        await tuan.close()
        await logged(gateway, "presence.failed", op="release")
        await until(lambda: not client.exists(presence_key(str(acme.environment.id), "tuan")))

        def settled() -> bool:
            # Either the entry went with the key, or it was pinned past what a refresh writes.
            score, now = client.zscore(fleet_set, "tuan"), client.time()
            return score is None or score - (now[0] * 1000 + now[1] // 1000) > TTL

        await until(settled)
        await sees_tuan_back_unannounced(gateway, acme)
        client.close()
    finally:
        presence_redis.close()


async def test_a_watcher_connecting_right_after_redis_restarted_empty_learns_who_stayed_online(live_instances, acme):
    # tuan stays connected throughout, so nothing is ever published about him: his instance's
    # refresh re-elects his key in the emptied Redis in silence. mai's snapshot is read before
    # that (his instance is frozen meanwhile) and must be repaired. A refresh interval long
    # beside the steps below: mai connects well before the live holders' re-election is due.
    server = EmbeddedRedis().start()
    try:
        a, b = live_instances(2, **timings(ttl=3000, refresh=1000, RELAY_REDIS_URL=server.url))
        await add_user(acme, "mai", ("fleet",))
        linh = await connect(a, acme, "linh")
        tuan = await connect(b, acme, "tuan")
        assert await heard(linh, "tuan", 1) == ["online"]
        async with frozen_through_an_empty_restart(server, a, b, "linh", "tuan"):
            mai = await connect(a, acme, "mai")
            assert "tuan" not in mai.of_type("presence.snapshot")[0]["online"]

        await mai.wait_for(lambda client: "tuan" in view(client))
        probe = await barrier(a, acme, [linh, mai], channel="fleet")
        assert mai.changes("tuan") == [{"user": "tuan", "state": "online"}]
        assert mai.changes("linh") == []
        assert states(linh, "tuan") == ["online"]
        await close_all(linh, mai, tuan, probe)
    finally:
        server.close()
