"""Webhooks against real instances, a real Redis and a real local receiver (docs/webhooks.md)."""

from datetime import UTC, datetime, timedelta

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from standardwebhooks.webhooks import Webhook

from devtools.embedded_redis import EmbeddedRedis
from presence.scripts import marker_key, presence_key
from tests.support import close_all, connect, heard, http, lines, timings, until, write_lock_held
from tests.webhook_helpers import Receiver, listening
from webhooks.models import Delivery

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# Short retries so a receiver that was down is caught up with in seconds.
FAST = {"RELAY_WEBHOOK_ALLOW_PRIVATE": "1", "RELAY_WEBHOOK_BACKOFF_MS": "100", "RELAY_WEBHOOK_CLAIM_MS": "1000"}


@pytest.fixture
def receiver():
    started = Receiver().start()
    yield started
    started.stop()


def subscribe(instance, tenant, url: str, kinds: list[str] | None = None) -> dict:
    status, body = http(
        "POST", f"{instance.http_url}/v1/webhooks", {"url": url, "events": kinds or ["*"]}, tenant.api_key
    )
    assert status == 201, body
    return body


def verified(secret: str, requests) -> list[dict]:
    """Every request's event, each verified with the standardwebhooks package (raises if one does not)."""
    return [Webhook(secret).verify(r.body, r.headers) for r in requests]


async def test_two_instances_send_one_event_per_transition_signed(live_instances, acme, receiver, fabric):
    gw0, gw1 = live_instances(2, **fabric(**timings(**FAST)))
    secret = subscribe(gw0, acme, receiver.url)["secret"]
    await listening([gw0, gw1])
    fleet = str(acme.channels["fleet"].id)
    # linh on both instances at once: one `online`, and the channel occupied once.
    a, b = await connect(gw0, acme, "linh"), await connect(gw1, acme, "linh")
    tuan = await connect(gw1, acme, "tuan")
    await receiver.wait("user.online", user="tuan")
    await close_all(a, b)
    assert await heard(tuan, "linh", 1) == ["offline"]
    offline = await receiver.wait("user.offline", user="linh")
    # tuan leaves last: both channels vacated, after linh's single offline.
    await tuan.close()
    await receiver.wait("channel.vacated", 2)
    assert len(receiver.of("user.online", user="linh")) == 1
    assert len(receiver.of("user.offline", user="linh")) == 1
    assert [r.event["data"]["channel"] for r in receiver.delivered("channel.occupied")].count(fleet) == 1
    assert sorted(r.event["data"]["channel"] for r in receiver.delivered("channel.vacated")) == sorted(
        str(c.id) for c in acme.channels.values()
    )
    events = verified(secret, receiver.delivered())
    assert {e["type"] for e in events} == {"user.online", "user.offline", "channel.occupied", "channel.vacated"}
    assert set(offline[0].event["data"]) == {"user", "last_seen_at"}
    assert len({r.id for r in receiver.delivered()}) == len(receiver.delivered())


async def test_each_status_change_is_one_event_whichever_way_it_was_made(live_instances, acme, receiver, staff):
    gw0, gw1 = live_instances(2, **timings(**FAST))
    secret = subscribe(gw0, acme, receiver.url, ["user.status"])["secret"]
    # Someone on each instance: both sweep for expiries.
    linh, tuan = await connect(gw0, acme, "linh"), await connect(gw1, acme, "tuan")
    until_soon = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
    await tuan.send("presence.set", {"status": "busy", "text": "in a meeting", "until": until_soon})
    (busy,) = await receiver.wait("user.status", status="busy")
    await receiver.wait("user.status", status="available")
    assert http("PUT", f"{gw0.http_url}/v1/users/tuan/status", {"status": "away"}, acme.api_key)[0] == 200
    await receiver.wait("user.status", status="away")
    # The same status again is no change; tuan hearing it back means it was stored.
    await tuan.send("presence.set", {"status": "away"})
    await tuan.wait_for(lambda c: len([p for p in c.of_type("presence.status") if p["user"] == "tuan"]) >= 4)
    response = await database_sync_to_async(staff.post)(
        f"/admin/presence/userstatus/{acme.users['tuan'].pk}/change/",
        {"status": "dnd", "text": "focus", "emoji": "", "until_0": "", "until_1": "", "invisible": ""},
    )
    assert response.status_code == 302
    await receiver.wait("user.status", status="dnd")
    rows = await database_sync_to_async(lambda: Delivery.objects.filter(event_type="user.status").count())()
    events = verified(secret, receiver.delivered())
    assert [e["data"]["status"] for e in events] == ["busy", "available", "away", "dnd"] and rows == 4
    data = busy.event["data"]
    assert data == {"user": "tuan", "status": "busy", "text": "in a meeting", "emoji": ""} | {
        "until": data["until"],
        "invisible": False,
    }
    assert abs(datetime.fromisoformat(data["until"]) - datetime.fromisoformat(until_soon)) < timedelta(milliseconds=1)
    # Both instances swept the expiry; one claimed it. Its log line follows the announcement,
    # which can come after the webhook (written with the claim) was delivered.
    await until(lambda: lines([gw0, gw1], "presence.status_expired", user="tuan"))
    assert len(lines([gw0, gw1], "presence.status_expired", user="tuan")) == 1
    await close_all(linh, tuan)


async def test_an_expiry_is_sent_once_while_nobody_is_connected_anywhere(live_instances, acme, receiver):
    gw0, gw1 = live_instances(2, **timings(**FAST))
    subscribe(gw0, acme, receiver.url, ["user.status"])
    await listening([gw0, gw1])
    until_soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    body = {"status": "away", "text": "lunch", "until": until_soon}
    assert http("PUT", f"{gw1.http_url}/v1/users/hermit/status", body, acme.api_key)[0] == 200
    await receiver.wait("user.status", user="hermit", status="available")
    rows = await database_sync_to_async(lambda: Delivery.objects.filter(event_type="user.status").count())()
    assert [r.event["data"]["status"] for r in receiver.delivered()] == ["away", "available"] and rows == 2
    # One claim (one webhook row each way, above); its log line can follow the webhook's delivery.
    await until(lambda: lines([gw0, gw1], "presence.status_expired", user="hermit"))
    assert len(lines([gw0, gw1], "presence.status_expired", user="hermit")) == 1


async def test_the_publishers_sigkill_right_after_the_transition_still_delivers(
    live_instances, acme, receiver, redis_client
):
    (gw0,) = live_instances(1, **timings(**FAST))
    subscribe(gw0, acme, receiver.url, ["user.online", "user.offline"])
    await listening([gw0])
    # gw0's worker may read linh's `online` off its stream but cannot write it to the outbox
    # before it dies: the event is left read and unacknowledged in Redis.
    with write_lock_held(settings.DATABASES["default"], "webhooks_delivery"):
        await connect(gw0, acme, "linh")
        await until(lambda: sum(s["pending"] for s in _groups(redis_client)) >= 1)
        gw0.kill()
    # A survivor claims the dead instance's entry and its reaper decides linh's `offline`.
    (gw1,) = live_instances(1, **timings(**FAST))
    await listening([gw1])
    await connect(gw1, acme, "tuan")
    await receiver.wait("user.offline", user="linh")
    online = await receiver.wait("user.online", user="linh")
    assert len(online) == 1
    assert sum(s["pending"] for s in _groups(redis_client)) == 0


def _groups(redis_client) -> list[dict]:
    """The webhook consumer group of every bucket stream that has one."""
    from webhooks.stream import GROUP, STREAMS

    found = []
    for key in STREAMS:
        if redis_client.exists(key):
            found += [g for g in redis_client.xinfo_groups(key) if g["name"] in (GROUP, GROUP.encode())]
    return found


async def test_a_failing_then_refusing_receiver_gets_everything_afterwards_with_the_same_ids(
    live_instances, acme, receiver
):
    (gw0,) = live_instances(1, **timings(**FAST))
    secret = subscribe(gw0, acme, receiver.url, ["member.added", "user.online", "user.offline"])["secret"]
    await listening([gw0])
    general = acme.channels["general"].id
    receiver.mode = 500
    assert http("PUT", f"{gw0.http_url}/v1/channels/{general}/members/hermit", api_key=acme.api_key)[0] == 201
    linh = await connect(gw0, acme, "linh")
    await until(lambda: len(receiver.requests) >= 4)
    # Then down altogether: connections refused.
    receiver.stop()
    await linh.close()
    await until(lambda: len([line for line in gw0.events("webhook.failed") if line["status"] is None]) >= 2)
    receiver.mode = 200
    receiver.start()
    member, online, offline = (
        await receiver.wait("member.added"),
        await receiver.wait("user.online", user="linh"),
        await receiver.wait("user.offline", user="linh"),
    )
    verified(secret, [*member, *online, *offline])
    failed_ids = {r.id for r in receiver.requests if r.answered == 500}
    delivered_ids = [r.id for r in receiver.delivered()]
    # Every failed attempt was an event since delivered under the same webhook-id, once.
    assert failed_ids and failed_ids <= set(delivered_ids)
    assert len(delivered_ids) == len(set(delivered_ids)) == 3
    retried = [r for r in receiver.requests if r.id == member[0].id]
    assert len(retried) >= 3 and len({r.body for r in retried}) == 1


async def test_410_disables_the_endpoint_and_another_endpoint_goes_on(live_instances, acme, receiver):
    (gw0,) = live_instances(1, **timings(**FAST))
    healthy = Receiver().start()
    try:
        receiver.mode = 410
        gone = subscribe(gw0, acme, receiver.url, ["member.added"])
        subscribe(gw0, acme, healthy.url, ["member.added"])
        general = acme.channels["general"].id
        assert http("PUT", f"{gw0.http_url}/v1/channels/{general}/members/hermit", api_key=acme.api_key)[0] == 201
        await healthy.wait("member.added")
        await until(lambda: gw0.events("webhook.failed"))
        assert gw0.events("webhook.failed")[0]["outcome"] == "disabled"
        assert gw0.events("webhook.failed")[0]["endpoint"] == gone["id"]
        # Disabled: the next event goes to the healthy endpoint only.
        http("DELETE", f"{gw0.http_url}/v1/channels/{general}/members/hermit", api_key=acme.api_key)
        assert http("PUT", f"{gw0.http_url}/v1/channels/{general}/members/hermit", api_key=acme.api_key)[0] == 201
        await healthy.wait("member.added", 2)
        assert len(receiver.requests) == 1
    finally:
        healthy.stop()


async def test_a_hanging_receiver_delays_neither_presence_nor_another_endpoint(live_instances, acme, receiver):
    (gw0,) = live_instances(1, **timings(**FAST, RELAY_WEBHOOK_TIMEOUT_MS=30_000))
    healthy = Receiver().start()
    try:
        receiver.mode = "hang"
        subscribe(gw0, acme, receiver.url)
        subscribe(gw0, acme, healthy.url)
        await listening([gw0])
        tuan = await connect(gw0, acme, "tuan")
        await until(lambda: receiver.hanging >= 1)
        # The hanging endpoint holds its own attempts open; presence and the other endpoint carry on.
        for user_id in ("linh", "hermit"):
            client = await connect(gw0, acme, user_id)
            await client.close()
        assert await heard(tuan, "linh", 2) == ["online", "offline"]
        await healthy.wait("user.offline", user="hermit")
        await healthy.wait("user.offline", user="linh")
        assert receiver.hanging >= 1 and not receiver.delivered()
        await tuan.close()
    finally:
        healthy.stop()


async def test_no_secret_or_body_reaches_the_logs(live_instances, acme, receiver):
    (gw0,) = live_instances(1, **timings(**FAST))
    secret = subscribe(gw0, acme, receiver.url + "?key=url-s3cret", ["message.created"])["secret"]
    await listening([gw0])
    linh = await connect(gw0, acme, "linh")
    receiver.mode = 500
    ack = await linh.send_and_ack({"channel": str(acme.channels["general"].id), "idem_key": "k", "text": "s3cret-text"})
    assert ack["type"] == "message.ack"
    await until(lambda: len(gw0.events("webhook.failed")) >= 2)
    receiver.mode = 200
    delivered = await receiver.wait("message.created")
    await until(lambda: gw0.events("webhook.delivered"))
    await linh.close()
    log = gw0.log_path.read_text()
    assert delivered[0].event["data"]["text"] == "s3cret-text"
    for secret_text in (
        secret,
        secret.removeprefix("whsec_"),
        "s3cret-text",
        delivered[0].headers["webhook-signature"],
    ):
        assert secret_text not in log
    assert gw0.events("webhook.delivered")[0]["status"] == 200


async def test_an_online_re_elected_by_the_refresh_is_sent_too(live_instances, acme, receiver, redis_client):
    (gw0,) = live_instances(1, **timings(**FAST))
    subscribe(gw0, acme, receiver.url, ["user.online"])
    await listening([gw0])
    tuan = await connect(gw0, acme, "tuan")
    await receiver.wait("user.online", user="tuan")
    environment = str(acme.environment.id)
    # What a grace check leaves after finding the key gone and saying `offline`: the refresh
    # re-elects tuan and says `online` again, to watchers and to the receiver alike.
    redis_client.delete(presence_key(environment, "tuan"))
    redis_client.set(marker_key(environment, "tuan"), "1")
    assert len(await receiver.wait("user.online", 2, user="tuan")) == 2
    await tuan.close()


async def test_after_a_presence_redis_restart_events_flow_again(live_instances, acme, receiver):
    presence_redis = EmbeddedRedis().start()
    try:
        (gw0,) = live_instances(1, **timings(**FAST, RELAY_PRESENCE_REDIS_URL=presence_redis.url))
        subscribe(gw0, acme, receiver.url, ["user.online"])
        await listening([gw0])
        linh = await connect(gw0, acme, "linh")
        await receiver.wait("user.online", user="linh")
        presence_redis.stop()
        presence_redis.start()  # empty: the streams and their consumer group are gone
        tuan = await connect(gw0, acme, "tuan")
        # The worker makes the group again and moves tuan's event.
        await receiver.wait("user.online", user="tuan")
        await close_all(linh, tuan)
    finally:
        presence_redis.close()


async def test_a_stopping_instance_hands_its_rows_back_for_another_to_send(live_instances, acme, receiver):
    slow = timings(**FAST, RELAY_WEBHOOK_TIMEOUT_MS=30_000)
    (gw0,) = live_instances(1, **slow)
    subscribe(gw0, acme, receiver.url, ["member.added"])
    receiver.mode = "hang"
    general = acme.channels["general"].id
    assert http("PUT", f"{gw0.http_url}/v1/channels/{general}/members/hermit", api_key=acme.api_key)[0] == 201
    await until(lambda: receiver.hanging >= 1)
    gw0.stop()
    assert gw0.process.returncode is not None
    # Its lease would outlast this test many times: the row was handed back as gw0 stopped.
    receiver.mode = 200
    live_instances(1, **slow)
    delivered = await receiver.wait("member.added")
    assert delivered[0].id == receiver.requests[0].id
    assert not [line for line in gw0.events() if line.get("event") == "webhook.release_failed"]
