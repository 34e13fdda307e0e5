"""Nothing lost to a Redis fault, across real Daphne processes on a private Redis that stops and returns.

docs/contract.md, "Convergence": after Redis returns from any outage, every connection's channels
equal the database's within two refresh intervals, and no subscription is lost to the outage.
In acme, linh and tuan share "fleet" (private) and "general".
"""

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from devtools.embedded_redis import EmbeddedRedis
from tests.chat_helpers import send_payload
from tests.support import BASE_DIR, WAIT, WsClient, add_channel, add_user, close_all, connect, http, logged, timings

pytestmark = pytest.mark.live

# No reconciliation round falls inside a test: only a notice can deliver a change in time.
SLOW_ROUNDS = timings(ttl=180_000, refresh=60_000)


@pytest.fixture
def private_redis() -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own, which it may stop and start again (empty) on the same port."""
    server = EmbeddedRedis().start()
    yield server
    server.close()


def message_ids(client: WsClient) -> list[str]:
    return [message["id"] for message in client.of_type("message.created")]


async def hears(client: WsClient, message: dict) -> None:
    await client.wait_for(lambda c: message["payload"]["id"] in message_ids(c))


async def test_a_process_that_starts_during_an_outage_subscribes_once_redis_returns(
    live_instances, acme, private_redis, closing
):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    private_redis.stop()
    (late,) = live_instances(1, RELAY_REDIS_URL=private_redis.url, **SLOW_ROUNDS)
    # linh connects while Redis is away: her instance's inbox, membership bus, rotation notices
    # and her channels' groups all fail to subscribe, and are admitted all the same.
    linh = await closing(WsClient.open(late.ws_url(acme.token("linh"))))
    assert (await linh.next_of("connection.ack"))["user"] == "linh"
    private_redis.start()
    await logged(late, "layer.reconnected")
    (other,) = live_instances(1, RELAY_REDIS_URL=private_redis.url, **SLOW_ROUNDS)
    tuan = await closing(connect(other, acme, "tuan"))

    # Her channels' groups: she hears fleet.
    await hears(linh, await tuan.send_and_ack(send_payload(fleet, "after the outage")))

    # The membership bus: her removal from general reaches her at once (no round is due for a minute).
    status, _ = http("DELETE", f"{other.http_url}/v1/channels/{general.id}/members/linh", api_key=acme.api_key)
    assert status == 204
    gone = await tuan.send_and_ack(send_payload(general, "linh has left general"))
    barrier = await tuan.send_and_ack(send_payload(fleet, "linh is still in fleet"))
    await hears(linh, barrier)
    assert gone["payload"]["id"] not in message_ids(linh)

    # The rotation notices: a new secret closes her socket at once.
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "manage.py", "rotatesecret", "acme"],
        env=other.env,
        capture_output=True,
        cwd=BASE_DIR,
        timeout=60,
    )
    assert done.returncode == 0
    assert await linh.closed(WAIT) == 4401


async def test_the_first_member_of_a_channel_to_connect_during_an_outage_hears_it_once_redis_returns(
    live_instances, acme, private_redis, closing
):
    await add_user(acme, "kim")
    lab = await add_channel(acme, "lab", "private", ("linh", "kim"))
    gw0, gw1 = live_instances(2, RELAY_REDIS_URL=private_redis.url, **SLOW_ROUNDS)
    tuan = await closing(connect(gw1, acme, "tuan"))  # gw1's inbox and notices are subscribed before the outage

    private_redis.stop()
    # The first of lab's members on gw1: its group's SUBSCRIBE fails, and is sent again later.
    linh = await closing(WsClient.open(gw1.ws_url(acme.token("linh"))))
    assert (await linh.next_of("connection.ack"))["user"] == "linh"
    private_redis.start()
    await logged(gw1, "layer.reconnected")

    kim = await closing(connect(gw0, acme, "kim"))
    await hears(linh, await kim.send_and_ack(send_payload(lab, "heard on gw1")))
    await close_all(linh, tuan, kim)


async def test_changes_made_while_redis_is_silent_answer_and_reach_the_connections(
    live_instances, acme, globex, private_redis, closing
):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    gw0, gw1 = live_instances(2, RELAY_REDIS_URL=private_redis.url, **timings())
    linh = await closing(connect(gw1, acme, "linh"))
    tuan = await closing(connect(gw0, acme, "tuan"))
    zed = await closing(connect(gw1, globex, "zed"))

    private_redis.pause()
    try:
        # Answered although Redis takes the notices and never replies: the changes are made,
        # their notices lost (http() gives up after 10 s, the command after 30 s).
        status, _ = await asyncio.to_thread(
            http, "DELETE", f"{gw0.http_url}/v1/channels/{fleet.id}/members/linh", api_key=acme.api_key
        )
        assert status == 204
        rotated = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "manage.py", "rotatesecret", "globex"],
            env=gw0.env,
            capture_output=True,
            cwd=BASE_DIR,
            timeout=30,
        )
        assert rotated.returncode == 0
    finally:
        private_redis.resume()
    await logged(gw1, "membership.repaired", user="linh", removed=1)
    assert await zed.closed(WAIT) == 4401

    after = await tuan.send_and_ack(send_payload(fleet, "after the removal"))
    barrier = await tuan.send_and_ack(send_payload(general, "linh is still in general"))
    await hears(linh, barrier)
    assert after["payload"]["id"] not in message_ids(linh)
    await close_all(linh, tuan)


async def test_a_member_added_while_redis_is_silent_is_announced_to_the_channel_once_it_answers(
    live_instances, acme, private_redis, closing
):
    # mai shares no channel with tuan until he is added to hers while Redis is paused: the
    # announcement's script gets no answer, and no transition of his would tell her later.
    await add_user(acme, "mai")
    ops = await add_channel(acme, "ops", "public", ("mai",))
    gw0, gw1 = live_instances(2, RELAY_REDIS_URL=private_redis.url, **timings(ttl=20_000, refresh=1000))
    tuan = await closing(connect(gw1, acme, "tuan"))
    mai = await closing(connect(gw0, acme, "mai"))
    assert "tuan" not in mai.of_type("presence.snapshot")[0]["online"]

    private_redis.pause()
    try:
        status, _ = await asyncio.to_thread(
            http, "PUT", f"{gw0.http_url}/v1/channels/{ops.id}/members/tuan", api_key=acme.api_key
        )
        assert status == 201
        await logged(gw0, "presence.failed", op="announce")
    finally:
        private_redis.resume()
    await logged(gw0, "presence.announced", user="tuan")
    await mai.wait_for(lambda c: any(change["user"] == "tuan" for change in c.changes()))
    assert mai.changes("tuan") == [{"user": "tuan", "state": "online"}]
    await close_all(mai, tuan)


async def test_a_removal_whose_process_died_before_its_notice_still_reaches_the_member(live_instances, acme, closing):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    gw0, gw1 = live_instances(2, **timings())
    linh = await closing(connect(gw1, acme, "linh"))
    tuan = await closing(connect(gw0, acme, "tuan"))

    # Committed, and the process is gone before any on-commit callback runs.
    died = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", DIES_AFTER_THE_COMMIT, str(fleet.id), str(acme.users["linh"].pk)],
        env=gw0.env,
        capture_output=True,
        text=True,
        cwd=BASE_DIR,
        timeout=60,
    )
    assert died.returncode == 3, died.stderr
    await logged(gw1, "membership.repaired", user="linh", removed=1)

    after = await tuan.send_and_ack(send_payload(fleet, "after the removal"))
    barrier = await tuan.send_and_ack(send_payload(general, "linh is still in general"))
    await hears(linh, barrier)
    assert after["payload"]["id"] not in message_ids(linh)
    await close_all(linh, tuan)


DIES_AFTER_THE_COMMIT = """
import os, sys
import django
django.setup()
from django.db import transaction
from relay.models import Membership
with transaction.atomic():
    transaction.on_commit(lambda: os._exit(3))  # registered first, so it runs before the notice's
    Membership.objects.filter(channel_id=sys.argv[1], user_id=int(sys.argv[2])).delete()
"""


LAGGY = {"DJANGO_SETTINGS_MODULE": "tests.laggy_settings"}


async def test_a_read_from_before_a_removal_does_not_bring_the_channel_back(live_instances, acme, closing):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    (laggy,) = live_instances(1, **timings(), **LAGGY)
    (other,) = live_instances(1, **timings())
    linh = await closing(connect(laggy, acme, "linh"))
    tuan = await closing(connect(other, acme, "tuan"))
    await logged(laggy, "test.read_held")  # linh's first round read fleet, and waits

    status, _ = http("DELETE", f"{other.http_url}/v1/channels/{fleet.id}/members/linh", api_key=acme.api_key)
    assert status == 204
    during = await tuan.send_and_ack(send_payload(fleet, "after the removal"))
    barrier = await tuan.send_and_ack(send_payload(general, "the removal's notice was applied"))
    await hears(linh, barrier)
    assert during["payload"]["id"] not in message_ids(linh)

    laggy.process.send_signal(signal.SIGUSR1)  # the read from before the removal arrives now
    await logged(laggy, "test.sync_applied")
    after = await tuan.send_and_ack(send_payload(fleet, "after the old read"))
    barrier = await tuan.send_and_ack(send_payload(general, "linh is still in general"))
    await hears(linh, barrier)
    assert after["payload"]["id"] not in message_ids(linh)
    await close_all(linh, tuan)


async def test_a_read_from_before_an_addition_does_not_take_the_channel_away(live_instances, acme, closing):
    general = acme.channels["general"]
    await add_channel(acme, "lab", "private", ("tuan",))
    lab = acme.channels["lab"]
    (laggy,) = live_instances(1, **timings(), **LAGGY)
    (other,) = live_instances(1, **timings())
    linh = await closing(connect(laggy, acme, "linh"))
    tuan = await closing(connect(other, acme, "tuan"))
    await logged(laggy, "test.read_held")  # linh's first round read her channels without lab, and waits

    status, _ = http("PUT", f"{other.http_url}/v1/channels/{lab.id}/members/linh", api_key=acme.api_key)
    assert status == 201
    await hears(linh, await tuan.send_and_ack(send_payload(lab, "welcome to lab")))

    laggy.process.send_signal(signal.SIGUSR1)  # the read from before the addition arrives now
    await logged(laggy, "test.sync_applied")
    after = await tuan.send_and_ack(send_payload(lab, "after the old read"))
    await hears(linh, after)
    barrier = await tuan.send_and_ack(send_payload(general, "and general as before"))
    await hears(linh, barrier)
    await close_all(linh, tuan)
