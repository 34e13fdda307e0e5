"""message.send and message.created on one in-process gateway: acks, fan-out, refusals, live membership.

Cast (conftest): in acme, linh and tuan share fleet (private) and general (public);
hermit belongs to nothing. globex has its own linh and zed in board.
"""

import contextlib
import logging

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from chat.handlers import chat_group
from chat.models import Message
from relay import membership
from relay.logging import event_fields
from relay.models import Channel
from tests.chat_helpers import MALFORMED_SENDS, malformed, send_payload
from tests.support import Socket, events

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def stored(channel: Channel | None = None) -> list[tuple[int, str]]:
    """(seq, text) of the stored messages, of one channel or all."""
    found = Message.objects.all() if channel is None else Message.objects.filter(channel=channel)
    return list(found.order_by("channel", "seq").values_list("seq", "text"))


@database_sync_to_async
def last_seq(channel: Channel) -> int:
    channel.refresh_from_db()
    return channel.last_seq


async def test_a_member_gets_an_ack_and_every_member_gets_message_created(acme, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    tuan = await closing(Socket.open(acme.token("tuan")))
    fleet = acme.channels["fleet"]

    ack = (await linh.send_and_ack(send_payload(fleet, "hello fleet", idem_key="k-1")))["payload"]

    assert set(ack) == {"idem_key", "id", "channel", "seq"}
    assert (ack["idem_key"], ack["channel"], ack["seq"]) == ("k-1", str(fleet.id), 1)
    for socket in (linh, tuan):
        created = await socket.next_of("message.created")
        assert set(created) == {"id", "channel", "seq", "user", "text", "created_at"}
        assert created["id"] == ack["id"]
        assert (created["channel"], created["seq"], created["user"], created["text"]) == (
            str(fleet.id),
            1,
            "linh",
            "hello fleet",
        )
        assert "T" in created["created_at"] and created["created_at"].endswith("+00:00")
    # The sender hears its ack before its own message.created.
    types = [frame["type"] for frame in linh.frames]
    assert types.index("message.ack") < types.index("message.created")


async def test_seqs_count_up_per_channel(acme, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    seqs = [
        (await linh.send_and_ack(send_payload(channel)))["payload"]["seq"] for channel in (fleet, fleet, general, fleet)
    ]
    assert seqs == [1, 2, 1, 3]
    assert (await last_seq(fleet), await last_seq(general)) == (3, 1)


async def test_an_idempotent_resend_gets_the_same_ack_and_stores_nothing(acme, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    tuan = await closing(Socket.open(acme.token("tuan")))
    fleet = acme.channels["fleet"]

    first = await linh.send_and_ack(send_payload(fleet, "once", idem_key="same"))
    again = await linh.send_and_ack(send_payload(fleet, "once, again", idem_key="same"))
    after = await linh.send_and_ack(send_payload(fleet, "next", idem_key="other"))

    assert again == first
    assert after["payload"]["seq"] == 2
    assert await stored(fleet) == [(1, "once"), (2, "next")]
    # tuan heard the message once: the resend was not fanned out again.
    await tuan.wait_for(lambda s: s.seqs() == [1, 2])


@pytest.mark.parametrize("flaw", sorted(MALFORMED_SENDS))
async def test_a_malformed_send_is_refused_with_nothing_stored_and_the_socket_kept(acme, flaw, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    fleet = acme.channels["fleet"]

    refusal = await linh.send_and_ack(malformed(flaw, str(fleet.id)))

    assert refusal["type"] == "error"
    assert refusal["payload"]["code"] == "invalid_frame"
    assert refusal["payload"]["type"] == "message.send"
    assert refusal["payload"]["message"]
    assert await stored() == []
    assert await last_seq(fleet) == 0
    # Same socket, a good frame: stored as seq 1, so the refusal burnt no seq.
    assert (await linh.send_and_ack(send_payload(fleet)))["payload"]["seq"] == 1
    assert linh.close_code is None


async def test_the_largest_well_formed_send_is_stored_whole(acme, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    fleet = acme.channels["fleet"]
    prefix = "line one\n\ttabbed 🚀 "
    text = prefix + "x" * (16_384 - len(prefix))
    assert len(text) == 16_384

    ack = await linh.send_and_ack(send_payload(fleet, text, idem_key="k" * 128))

    assert ack["type"] == "message.ack"
    assert await stored(fleet) == [(1, text)]
    assert (await linh.next_of("message.created"))["text"] == text


async def test_a_non_member_is_refused_and_a_member_is_not(acme, globex, closing):
    hermit = await closing(Socket.open(acme.token("hermit")))
    outsider = await closing(Socket.open(globex.token("linh")))
    linh = await closing(Socket.open(acme.token("linh")))
    fleet = acme.channels["fleet"]

    for socket in (hermit, outsider):
        refusal = await socket.send_and_ack(send_payload(fleet, "let me in"))
        assert refusal["type"] == "error"
        assert (refusal["payload"]["code"], refusal["payload"]["type"]) == ("not_a_member", "message.send")
    # An unknown channel gets the same answer as another tenant's: existence is not revealed.
    unknown = await linh.send_and_ack(send_payload("00000000-0000-4000-8000-000000000000"))
    assert unknown["payload"]["code"] == "not_a_member"
    assert await stored() == []

    assert (await linh.send_and_ack(send_payload(fleet, "members only")))["payload"]["seq"] == 1
    assert await stored() == [(1, "members only")]
    await linh.next_of("message.created")
    assert hermit.of_type("message.created") == [] and outsider.of_type("message.created") == []
    for socket in (hermit, outsider, linh):
        await socket.close()


async def test_a_removed_member_stops_receiving_the_channels_messages_at_once(acme, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    tuan = await closing(Socket.open(acme.token("tuan")))
    fleet, general = acme.channels["fleet"], acme.channels["general"]

    await database_sync_to_async(membership.remove_member)(fleet, acme.users["tuan"])
    await linh.send_and_ack(send_payload(fleet, "after tuan left"))
    await linh.send_and_ack(send_payload(general, "still shared"))

    # general's message proves tuan's pipe works; fleet's was published before it.
    await tuan.wait_for(lambda s: s.seqs(general) == [1])
    assert tuan.seqs(fleet) == []
    assert linh.seqs(fleet) == [1]
    refusal = await tuan.send_and_ack(send_payload(fleet, "can I still post?"))
    assert refusal["payload"]["code"] == "not_a_member"


async def test_a_member_added_live_starts_receiving_without_reconnecting(acme, closing):
    hermit = await closing(Socket.open(acme.token("hermit")))
    linh = await closing(Socket.open(acme.token("linh")))
    fleet = acme.channels["fleet"]

    await linh.send_and_ack(send_payload(fleet, "before hermit joined"))
    await database_sync_to_async(membership.add_member)(fleet, acme.users["hermit"])
    # The change reaches hermit's socket through its user group, asynchronously:
    # linh keeps talking until hermit hears something.
    for attempt in range(50):
        await linh.send_and_ack(send_payload(fleet, f"anyone there? {attempt}"))
        with contextlib.suppress(TimeoutError):
            await hermit.wait_for(lambda s: s.seqs(fleet), timeout=0.2)
        if hermit.seqs(fleet):
            break
    own = (await hermit.send_and_ack(send_payload(fleet, "hermit speaks")))["payload"]["seq"]

    await hermit.wait_for(lambda s: s.seqs(fleet)[-1:] == [own])
    await linh.wait_for(lambda s: s.seqs(fleet) == list(range(1, own + 1)))
    # Live from the moment it joined: in order, and nothing from before it joined.
    heard = hermit.seqs(fleet)
    assert heard == list(range(heard[0], own + 1))
    assert heard[0] > 1


async def test_message_text_is_never_logged(acme, caplog, closing):
    caplog.set_level(logging.DEBUG)
    linh = await closing(Socket.open(acme.token("linh")))
    secret = "the launch code is 0000"

    await linh.send_and_ack(send_payload(acme.channels["fleet"], secret))
    await linh.next_of("message.created")

    stored_events = events(caplog, "message.stored")
    assert stored_events == [{"user": "linh", "channel": str(acme.channels["fleet"].id), "seq": 1}]
    for record in caplog.records:
        assert secret not in record.getMessage()
        assert secret not in repr(event_fields(record))


async def test_an_event_that_is_not_a_message_is_dropped_not_delivered(acme, caplog, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    fleet = acme.channels["fleet"]
    # A presence-shaped payload on the message fabric: it must never become a message.created.
    await get_channel_layer().group_send(
        chat_group(str(fleet.id)), {"type": "message.created", "message": {"user": "tuan", "state": "online"}}
    )
    await linh.send_and_ack(send_payload(fleet, "a real one"))

    await linh.wait_for(lambda s: s.seqs(fleet) == [1])
    assert len(linh.of_type("message.created")) == 1
    assert "message.invalid_event" in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("server_type", ["message.created", "message.ack"])
async def test_a_client_cannot_send_a_server_message_frame(acme, server_type, closing):
    linh = await closing(Socket.open(acme.token("linh")))
    tuan = await closing(Socket.open(acme.token("tuan")))
    fleet = acme.channels["fleet"]
    forged = {"id": "x", "channel": str(fleet.id), "seq": 1, "user": "tuan", "text": "forged", "created_at": "now"}

    await linh.send(server_type, forged)
    refusal = await linh.next_of("error")
    await linh.send_and_ack(send_payload(fleet, "real"))

    assert refusal["code"] == "invalid_frame"
    await tuan.wait_for(lambda s: s.seqs() == [1])
    assert [m["text"] for m in tuan.of_type("message.created")] == ["real"]
    assert await stored() == [(1, "real")]
