"""Chat across real Daphne processes on one Redis and one database file: fan-out, resends, refusals, seqs, resume.

Cast (conftest): in acme, linh and tuan share fleet and general; hermit belongs to
nothing. globex's linh and zed share board.
"""

import asyncio
import uuid
from urllib.parse import quote

import pytest
from channels.db import database_sync_to_async

from chat.models import Message
from relay.models import Channel
from tests.chat_helpers import MALFORMED_SENDS, malformed, send_payload, store_history
from tests.support import WsClient, connect, http

pytestmark = pytest.mark.live

DEAD_REDIS = "redis://127.0.0.1:1/0"


@database_sync_to_async
def stored(channel: Channel) -> list[int]:
    return list(Message.objects.filter(channel=channel).order_by("seq").values_list("seq", flat=True))


async def test_a_message_reaches_every_members_connections_on_every_instance(live_instances, acme, globex, closing):
    a, b = live_instances(2)
    fleet, board = acme.channels["fleet"], globex.channels["board"]
    linh_a = await closing(connect(a, acme, "linh"))
    linh_b = await closing(connect(b, acme, "linh"))
    tuan_b = await closing(connect(b, acme, "tuan"))
    stranger_b = await closing(connect(b, globex, "linh"))
    zed_a = await closing(connect(a, globex, "zed"))

    ack = await linh_a.send_and_ack(send_payload(fleet, "across instances"))
    assert ack["type"] == "message.ack"
    for client in (linh_a, linh_b, tuan_b):
        created = await client.next_of("message.created", timeout=15)
        assert (created["id"], created["seq"], created["user"], created["text"]) == (
            ack["payload"]["id"],
            1,
            "linh",
            "across instances",
        )

    # globex's linh hears her own channel (the pipe works) and never acme's message.
    await zed_a.send_and_ack(send_payload(board, "board only"))
    await stranger_b.wait_for(lambda c: c.seqs(board) == [1], timeout=15)
    assert [m["channel"] for m in stranger_b.of_type("message.created")] == [str(board.id)]
    assert tuan_b.seqs() == [1] and linh_b.seqs(fleet) == [1]
    for client in (linh_a, linh_b, tuan_b, stranger_b, zed_a):
        await client.close()


async def test_a_resend_from_another_instance_gets_the_same_ack_and_one_message(live_instances, acme, closing):
    a, b = live_instances(2)
    fleet = acme.channels["fleet"]
    tuan = await closing(connect(b, acme, "tuan"))
    first_socket = await closing(connect(a, acme, "linh"))

    first = await first_socket.send_and_ack(send_payload(fleet, "did this arrive?", idem_key="idem-1"))
    # The sender lost its socket before it saw the ack, and resends through another instance.
    await first_socket.close()
    second_socket = await closing(connect(b, acme, "linh"))
    again = await second_socket.send_and_ack(send_payload(fleet, "did this arrive?", idem_key="idem-1"))
    after = await second_socket.send_and_ack(send_payload(fleet, "next one", idem_key="idem-2"))

    assert again == first
    assert after["payload"]["seq"] == 2
    assert await stored(fleet) == [1, 2]
    await tuan.wait_for(lambda c: c.seqs() == [1, 2], timeout=15)


async def test_a_non_member_is_refused_on_any_instance_and_nothing_is_stored(live_instances, acme, globex, closing):
    a, b = live_instances(2)
    fleet = acme.channels["fleet"]
    hermit = await closing(connect(a, acme, "hermit"))
    outsider = await closing(connect(b, globex, "linh"))
    linh = await closing(connect(b, acme, "linh"))
    tuan = await closing(connect(a, acme, "tuan"))

    for client in (hermit, outsider):
        refusal = await client.send_and_ack(send_payload(fleet, "let me in"))
        assert refusal["payload"]["code"] == "not_a_member"
    assert await stored(fleet) == []

    assert (await linh.send_and_ack(send_payload(fleet, "members only")))["payload"]["seq"] == 1
    await tuan.wait_for(lambda c: [m["text"] for m in c.of_type("message.created")] == ["members only"], timeout=15)
    assert await stored(fleet) == [1]
    for client in (hermit, outsider, linh, tuan):
        await client.close()


async def test_forty_concurrent_sends_from_two_instances_get_forty_consecutive_seqs(live_instances, acme, closing):
    a, b = live_instances(2)
    fleet = acme.channels["fleet"]
    senders = [await closing(connect(instance, acme, user)) for instance in (a, b) for user in ("linh", "tuan")]

    async def send_ten(client: WsClient) -> None:
        # Pipelined: the next frame goes out before the previous one is acknowledged.
        for n in range(10):
            await client.send("message.send", send_payload(fleet, f"burst {n}"))

    await asyncio.gather(*(send_ten(client) for client in senders))
    for client in senders:
        await client.wait_for(lambda c: len(c.of_type("message.ack")) == 10, timeout=60)

    acked = sorted(ack["seq"] for client in senders for ack in client.of_type("message.ack"))
    assert acked == list(range(1, 41))
    assert await stored(fleet) == list(range(1, 41))
    for client in senders:
        # Every connection hears each of the forty once.
        await client.wait_for(lambda c: len(c.seqs()) >= 40, timeout=30)
        assert sorted(client.seqs()) == list(range(1, 41))
        await client.close()
    assert all(client.of_type("error") == [] for client in senders)


async def test_a_resume_while_messages_are_being_sent_has_no_gap_and_no_duplicate(live_instances, acme, closing):
    a, b = live_instances(2)
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 300)
    tuan = await closing(connect(a, acme, "tuan"))

    async def send_twenty() -> None:
        for n in range(20):
            await tuan.send("message.send", send_payload(fleet, f"while resuming {n}"))

    # linh resumes from 0 on b while tuan's twenty are stored and fanned out on a.
    linh, _ = await asyncio.gather(closing(connect(b, acme, "linh", {str(fleet.id): 0})), send_twenty())

    await linh.wait_for(lambda c: len(c.seqs()) >= 320, timeout=60)
    await tuan.wait_for(lambda c: len(c.of_type("message.ack")) == 20, timeout=30)
    assert linh.seqs() == list(range(1, 321))
    # Nothing after: a late duplicate would land behind 320, so send one more and see it next.
    await tuan.send_and_ack(send_payload(fleet, "after"))
    await linh.wait_for(lambda c: len(c.seqs()) >= 321, timeout=15)
    assert linh.seqs() == list(range(1, 322))


async def test_messages_still_flow_with_presence_redis_at_a_dead_port(live_instances, acme, closing):
    a, b = live_instances(2, RELAY_PRESENCE_REDIS_URL=DEAD_REDIS)
    fleet = acme.channels["fleet"]
    # Proof that presence's Redis really is unreachable in these processes.
    status, body = http("GET", f"{a.http_url}/readyz")
    assert status == 503 and body["checks"]["presence_redis"] != "ok" and body["checks"]["redis"] == "ok"

    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan", {str(fleet.id): 0}))
    ack = await linh.send_and_ack(send_payload(fleet, "presence is down and this still arrives"))

    assert ack["type"] == "message.ack"
    created = await tuan.next_of("message.created", timeout=15)
    assert created["text"] == "presence is down and this still arrives"


async def test_every_malformed_send_is_refused_nothing_is_stored_and_the_socket_stays(live_instances, acme, closing):
    (a,) = live_instances(1)
    fleet = acme.channels["fleet"]
    linh = await closing(connect(a, acme, "linh"))

    for flaw in sorted(MALFORMED_SENDS):
        answer = await linh.send_and_ack(malformed(flaw, str(fleet.id)))
        assert (answer["type"], answer["payload"]["code"]) == ("error", "invalid_frame"), flaw
    assert await stored(fleet) == []

    ok = await linh.send_and_ack(send_payload(fleet, "well formed", idem_key=str(uuid.uuid4())))
    assert ok["payload"]["seq"] == 1
    assert linh.close_code is None


async def test_a_cursor_nested_a_thousand_deep_gets_invalid_cursor_and_the_socket_stays_open(
    live_instances, acme, closing
):
    (gw,) = live_instances(1)
    fleet = acme.channels["fleet"]
    deep = "[" * 1000 + "]" * 1000
    for raw in (deep, f'{{"{fleet.id}": {deep}}}'):
        linh = await closing(WsClient.open(f"{gw.ws_url(acme.token('linh'))}&cursor={quote(raw)}"))
        error = await linh.next_of("error")
        assert (error["code"], error["message"][:8]) == ("invalid_cursor", "cursor: ")
        ack = await linh.send_and_ack(send_payload(fleet, "still served"))
        assert ack["type"] == "message.ack"
    assert gw.events("connection.hook_failed") == []
