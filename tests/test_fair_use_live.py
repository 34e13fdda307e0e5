"""Fair use on real Daphne processes and a real Redis: rate limits, bounded input, cheap refusals.

docs/contract.md, Fair use. Each test runs a well-behaved client beside the abusive one, so a
refusal is told apart from a broken server.
"""

import asyncio
import time
import uuid

import pytest
from channels.db import database_sync_to_async
from websockets.exceptions import InvalidHandshake

from agents.models import Registration
from chat.models import Message
from relay.models import Membership
from tests.chat_helpers import store_history
from tests.support import WsClient, close_all, http, http_with_headers

pytestmark = pytest.mark.live


def rate_limited(client: WsClient) -> list[dict]:
    return [error for error in client.of_type("error") if error["code"] == "rate_limited"]


@database_sync_to_async
def stored_idem_keys(channel) -> set[str]:
    return set(Message.objects.filter(channel=channel).values_list("idem_key", flat=True))


async def linh_and_tuan_at_20_frames_a_second(live_instances, acme) -> tuple[str, WsClient, WsClient]:
    """general's id, and linh and tuan connected (acknowledged) to one instance that takes 20 frames a second."""
    (instance,) = live_instances(1, RELAY_RATE_FRAMES_PER_S="20")
    linh = await WsClient.open(instance.ws_url(acme.token("linh")))
    tuan = await WsClient.open(instance.ws_url(acme.token("tuan")))
    await linh.next_of("connection.ack")
    await tuan.next_of("connection.ack")
    return str(acme.channels["general"].id), linh, tuan


async def test_frames_past_a_connections_rate_are_refused_and_change_nothing(live_instances, acme):
    general, linh, tuan = await linh_and_tuan_at_20_frames_a_second(live_instances, acme)
    sent = [str(uuid.uuid4()) for _ in range(120)]
    started = time.monotonic()
    for key in sent:
        await linh.send("message.send", {"idem_key": key, "channel": general, "text": "flood"})
    # Every frame is answered once: acknowledged, or refused with how long to wait.
    await linh.wait_for(lambda client: len(client.of_type("message.ack")) + len(rate_limited(client)) == len(sent))
    elapsed = time.monotonic() - started
    acked = {ack["idem_key"] for ack in linh.of_type("message.ack")}
    refused = rate_limited(linh)
    # The burst (twice the rate) goes through, and no more than the rate after it; the excess is refused.
    assert 40 <= len(acked) <= 40 + 20 * elapsed + 1 and refused
    assert all(set(error) == {"code", "message", "retry_after_ms"} for error in refused)
    assert all(error["retry_after_ms"] > 0 for error in refused)
    # A refused message was not stored, and was not delivered to the channel's other member.
    assert await stored_idem_keys(acme.channels["general"]) == acked
    await tuan.wait_for(lambda client: len(client.of_type("message.created")) == len(acked))
    assert {created["id"] for created in tuan.of_type("message.created")} == {
        ack["id"] for ack in linh.of_type("message.ack")
    }
    # Every kind of frame counts, malformed ones included; the socket stays open throughout.
    for _ in range(60):
        await linh.send_raw("not json")
    malformed = lambda client: [e for e in client.of_type("error") if e["code"] == "invalid_frame"]  # noqa: E731
    await linh.wait_for(lambda client: len(malformed(client)) + len(rate_limited(client)) == len(refused) + 60)
    assert len(rate_limited(linh)) > len(refused)
    assert linh.close_code is None
    # Once the wait it was told has passed, the same connection is heard again.
    await asyncio.sleep(rate_limited(linh)[-1]["retry_after_ms"] / 1000)
    answer = await linh.send_and_ack({"idem_key": str(uuid.uuid4()), "channel": general, "text": "calm"})
    assert answer["type"] == "message.ack"
    # Another connection on the same instance was never limited by the flood.
    answer = await tuan.send_and_ack({"idem_key": str(uuid.uuid4()), "channel": general, "text": "hi"})
    assert answer["type"] == "message.ack"
    assert rate_limited(tuan) == []
    await close_all(linh, tuan)


async def test_a_connection_over_its_rate_is_not_read_until_its_wait_has_passed(live_instances, acme):
    general, linh, tuan = await linh_and_tuan_at_20_frames_a_second(live_instances, acme)
    for _ in range(60):
        await linh.send_raw("not json")
    await linh.wait_for(lambda client: len(client.of_type("error")) == 60)
    first = rate_limited(linh)[0]
    # Going over the rate costs at least a second, whatever the window would allow sooner.
    assert first["retry_after_ms"] >= 1000
    # A frame sent now waits unread in the socket: nothing answers it within the wait ...
    await linh.send("message.send", {"idem_key": "late", "channel": general, "text": "after the flood"})
    answer = await tuan.send_and_ack({"idem_key": "meanwhile", "channel": general, "text": "hi"})
    assert answer["type"] == "message.ack"
    await asyncio.sleep(0.3)
    assert len(linh.of_type("error")) == 60 and linh.of_type("message.ack") == []
    # ... and once it has passed, the frame is read and answered.
    await linh.wait_for(lambda client: len(client.of_type("error")) + len(client.of_type("message.ack")) == 61)
    assert linh.close_code is None
    await close_all(linh, tuan)


def test_tokens_past_an_api_keys_rate_get_429_with_retry_after_on_every_instance(live_instances, acme, globex):
    one, two = live_instances(2, RELAY_RATE_TOKENS_PER_S="2")
    globex.add_user("mai")
    answers = [
        http_with_headers("POST", f"{instance.http_url}/v1/tokens", {"user": "linh"}, acme.api_key)
        for instance in (one, two) * 5
    ]
    statuses = [status for status, _, _ in answers]
    assert statuses.count(201) >= 2 and 429 in statuses
    for status, body, headers in answers:
        if status == 429:
            assert body == {"error": {"code": "rate_limited", "message": "too many tokens minted with this key"}}
            assert int(headers["Retry-After"]) >= 1
    # The count is the key's: another tenant's key mints on the same instances meanwhile.
    assert http("POST", f"{one.http_url}/v1/tokens", {"user": "mai"}, globex.api_key)[0] == 201


def test_members_past_either_cap_are_refused_409_and_nothing_is_added(live_instances, acme):
    (instance,) = live_instances(1, RELAY_MAX_CHANNELS_PER_USER="3", RELAY_MAX_MEMBERS_PER_CHANNEL="3")
    members = f"{instance.http_url}/v1/channels/{{}}/members/{{}}"
    fleet, general = (str(acme.channels[name].id) for name in ("fleet", "general"))
    channels = f"{instance.http_url}/v1/channels"
    rooms = [http("POST", channels, {"name": f"room-{n}"}, acme.api_key)[1]["id"] for n in range(2)]
    for user_id in ("mai", "an"):
        assert http("POST", f"{instance.http_url}/v1/users", {"id": user_id}, acme.api_key)[0] == 201
    # Linh is in fleet and general: one more channel, then her cap.
    assert http("PUT", members.format(rooms[0], "linh"), None, acme.api_key)[0] == 201
    assert http("PUT", members.format(rooms[1], "linh"), None, acme.api_key) == (
        409,
        {"error": {"code": "limit_reached", "message": "RELAY_MAX_CHANNELS_PER_USER (3) reached"}},
    )
    # Already a member stays a 200, at the cap as below it.
    assert http("PUT", members.format(rooms[0], "linh"), None, acme.api_key)[0] == 200
    # General has linh and tuan: one more member, then its cap.
    assert http("PUT", members.format(general, "mai"), None, acme.api_key)[0] == 201
    status, body = http("PUT", members.format(general, "an"), None, acme.api_key)
    assert (status, body["error"]["code"]) == (409, "limit_reached")
    assert "RELAY_MAX_MEMBERS_PER_CHANNEL" in body["error"]["message"]
    # Nothing was added by a refusal: an is in no channel, and a removal makes room again.
    assert not Membership.objects.filter(user__environment=acme.environment, user__external_id="an").exists()
    assert http("DELETE", members.format(general, "mai"), None, acme.api_key)[0] == 204
    assert http("PUT", members.format(general, "an"), None, acme.api_key)[0] == 201
    assert http("PUT", members.format(fleet, "mai"), None, acme.api_key)[0] == 201


async def test_agent_registrations_past_the_identitys_cap_are_refused_and_nothing_is_stored(live_instances, acme):
    (instance,) = live_instances(1, RELAY_MAX_AGENTS_PER_USER="2")
    linh = await WsClient.open(instance.ws_url(acme.token("linh")))
    tuan = await WsClient.open(instance.ws_url(acme.token("tuan")))
    await linh.next_of("connection.ack")
    await tuan.next_of("connection.ack")
    for count, name in enumerate(("w-1", "w-2"), start=1):
        await linh.send("register", {"instance": name, "capability": {}})
        await linh.wait_for(lambda client, count=count: len(client.of_type("register.ack")) == count)
    await linh.send("register", {"instance": "w-3", "capability": {}})
    refused = await linh.next_of("error")
    assert (refused["code"], refused["type"]) == ("limit_reached", "register")
    # A re-registration of one it holds is no new row, and another identity has a cap of its own.
    await linh.send("register", {"instance": "w-1", "capability": {"weight": 2}})
    await linh.wait_for(lambda client: len(client.of_type("register.ack")) == 3)
    await tuan.send("register", {"instance": "w-3", "capability": {}})
    assert (await tuan.next_of("register.ack"))["instance"] == "w-3"
    assert await registered(acme) == {("linh", "w-1"), ("linh", "w-2"), ("tuan", "w-3")}
    await close_all(linh, tuan)


@database_sync_to_async
def registered(tenant) -> set[tuple[str, str]]:
    rows = Registration.objects.filter(environment=tenant.environment)
    return set(rows.values_list("identity__external_id", "instance"))


async def test_a_cursor_too_long_for_a_url_resumes_as_the_first_frame(live_instances, acme):
    (instance,) = live_instances(1)
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    await database_sync_to_async(store_history)(general, acme.users["tuan"], 5)
    # Four hundred channels in the cursor: as a URL, past Daphne's 16 KB head, never opens.
    cursor = {str(uuid.uuid4()): 1 for _ in range(400)} | {str(general.id): 2}
    with pytest.raises(InvalidHandshake):
        await WsClient.open(instance.ws_url(acme.token("linh"), cursor))
    linh = await WsClient.open(instance.ws_url(acme.token("linh")) + "&resume=frame")
    tuan = await WsClient.open(instance.ws_url(acme.token("tuan")))
    await linh.next_of("connection.ack")
    await tuan.next_of("connection.ack")
    # Sent live before linh's resume: held, and never ahead of the backfill.
    for channel, key in ((general, "live-general"), (fleet, "live-fleet")):
        answer = await tuan.send_and_ack({"idem_key": key, "channel": str(channel.id), "text": key})
        assert answer["type"] == "message.ack"
    await linh.send("resume", {"cursor": cursor})
    await linh.wait_for(lambda client: len(client.of_type("message.created")) == 5)
    created = [(message["channel"], message["seq"]) for message in linh.of_type("message.created")]
    # Fleet (no position) is released at once; general's 3 to 5, then its live 6, none twice.
    assert created == [(str(fleet.id), 1), *((str(general.id), seq) for seq in (3, 4, 5, 6))]
    # Only ever the first frame.
    await linh.send("resume", {"cursor": {}})
    assert (await linh.next_of("error"))["type"] == "resume"
    await close_all(linh, tuan)


async def test_the_python_client_sends_a_cursor_too_long_for_a_url_as_the_first_frame(live_instances, acme):
    from relay_client import Client

    from tests.client_helpers import Application

    (instance,) = live_instances(1)
    general = acme.channels["general"]
    await database_sync_to_async(store_history)(general, acme.users["tuan"], 5)
    cursor = {str(uuid.uuid4()): 1 for _ in range(400)} | {str(general.id): 2}
    client = Client(f"ws://127.0.0.1:{instance.port}", acme.token("linh"), cursor=cursor)
    await asyncio.wait_for(client.connect(), 30)
    app = Application(client)
    await app.until(lambda app: app.seqs(str(general.id)) == [3, 4, 5])
    await client.close()


def peak_rss_mb(instance) -> float:
    """The instance's peak resident memory so far (VmHWM), in MB."""
    for line in open(f"/proc/{instance.process.pid}/status").read().splitlines():  # noqa: SIM115
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.solo
async def test_five_flooding_sockets_queue_a_bounded_input_and_an_innocent_user_still_gets_through(
    live_instances, acme
):
    # The rate limit out of the way: what is left to hold the flood back is the bound on input.
    (instance,) = live_instances(1, RELAY_RATE_FRAMES_PER_S="1000000")
    general = str(acme.channels["general"].id)
    flooders = [await WsClient.open(instance.ws_url(acme.token("tuan"))) for _ in range(5)]
    for flooder in flooders:
        await flooder.next_of("connection.ack")
    before = peak_rss_mb(instance)
    text = "x" * 16_384  # each one a database write: the consumers fall behind at once

    async def flood(client: WsClient, number: int) -> None:
        for n in range(1_000):
            await client.send("message.send", {"idem_key": f"f{number}-{n}", "channel": general, "text": text})

    floods = [asyncio.create_task(flood(flooder, number)) for number, flooder in enumerate(flooders)]
    # An innocent user connects, sends and is acknowledged while the flood goes on.
    await flooders[0].wait_for(lambda client: client.of_type("message.ack"))
    linh = await WsClient.open(instance.ws_url(acme.token("linh")))
    await linh.next_of("connection.ack")
    answer = await linh.send_and_ack({"idem_key": "innocent", "channel": general, "text": "hello"}, timeout=60)
    assert answer["type"] == "message.ack"
    # The flood was still going: its sends wait on the client's side, not in the instance.
    assert not all(flood.done() for flood in floods)
    grown = peak_rss_mb(instance) - before
    # 80 MB sent at the instance; what it may hold of them is about 1 MiB a connection.
    assert grown < 5 * 8, f"{grown:.1f} MB"
    for flood in floods:
        flood.cancel()
    await close_all(linh, *flooders)
