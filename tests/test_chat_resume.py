"""Resume with `cursor`: missed messages in seq order, then live ones, with no gap and no duplicate.

The races (a message stored or published while a backfill runs) are staged here
deterministically by wrapping the backfill's database reads; the same property
under real concurrency across two Daphne processes is in test_chat_live.py.
"""

import asyncio
import json
import logging

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import DatabaseError

from chat import handlers
from chat.actions import send_message
from chat.handlers import chat_group
from relay import close_codes
from tests.chat_helpers import send_payload, store_history
from tests.support import Socket, until

pytestmark = pytest.mark.django_db(transaction=True)

UNKNOWN_CHANNEL = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def chat_states(monkeypatch: pytest.MonkeyPatch) -> list[handlers.ChatState]:
    """Every connection's chat state, so a test can see which messages it holds back."""
    made: list[handlers.ChatState] = []

    class RecordedChatState(handlers.ChatState):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(handlers, "ChatState", RecordedChatState)
    return made


def cursor(**positions: int) -> str:
    return json.dumps(positions)


async def test_a_resume_sends_what_was_missed_in_seq_order_then_live_ones(acme, closing):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 5)
    await database_sync_to_async(store_history)(general, acme.users["tuan"], 3)

    linh = await closing(Socket.open(acme.token("linh"), json.dumps({str(fleet.id): 2, str(general.id): 0})))
    await linh.wait_for(lambda s: len(s.seqs()) == 6)
    tuan = await closing(Socket.open(acme.token("tuan")))
    await tuan.send_and_ack(send_payload(fleet, "live"))

    await linh.wait_for(lambda s: s.seqs(fleet) == [3, 4, 5, 6])
    assert linh.seqs(general) == [1, 2, 3]
    assert linh.frames[0]["type"] == "connection.ack"
    backfilled = next(m for m in linh.of_type("message.created") if m["channel"] == str(fleet.id))
    assert (backfilled["user"], backfilled["text"]) == ("tuan", "message 3")


async def test_an_empty_cursor_resumes_nothing_and_live_messages_flow(acme, closing):
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 3)

    linh = await closing(Socket.open(acme.token("linh"), "{}"))
    await linh.send_and_ack(send_payload(fleet, "live"))

    await linh.wait_for(lambda s: s.seqs() == [4])
    assert linh.of_type("error") == []


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[]",
        '"{}"',
        '{"fleet": 1}',
        '{"%(fleet)s": -1}',
        '{"%(fleet)s": "3"}',
        '{"%(fleet)s": 1.5}',
        '{"%(fleet)s": true}',
        '{"%(fleet)s": null}',
        '{"%(fleet)s": {"seq": 1}}',
    ],
)
async def test_a_malformed_cursor_gets_an_error_no_backfill_and_the_socket_stays_open(acme, raw, closing):
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 3)

    linh = await closing(Socket.open(acme.token("linh"), raw % {"fleet": fleet.id}))
    error = await linh.next_of("error")
    await linh.send_and_ack(send_payload(fleet, "live"))

    assert error["code"] == "invalid_cursor"
    assert error["message"].startswith("cursor: ")
    await linh.wait_for(lambda s: s.seqs() == [4])
    assert linh.close_code is None


async def test_two_cursors_are_refused_rather_than_one_picked(acme, closing):
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 2)

    linh = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): 0}), extra_query="&cursor=%7B%7D"))
    error = await linh.next_of("error")
    await linh.send_and_ack(send_payload(fleet, "live"))

    assert error["code"] == "invalid_cursor"
    await linh.wait_for(lambda s: s.seqs() == [3])


async def test_a_cursor_naming_channels_the_user_is_not_in_resumes_only_its_own(acme, globex, closing):
    fleet, board = acme.channels["fleet"], globex.channels["board"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 2)
    await database_sync_to_async(store_history)(board, globex.users["zed"], 4)
    await database_sync_to_async(store_history)(acme.channels["general"], acme.users["tuan"], 2)

    # board is globex's; general is one linh belongs to but did not ask to resume.
    linh = await closing(
        Socket.open(acme.token("linh"), json.dumps({str(board.id): 0, UNKNOWN_CHANNEL: 0, str(fleet.id): 0}))
    )
    await linh.send_and_ack(send_payload(fleet, "live"))

    await linh.wait_for(lambda s: s.seqs(fleet) == [1, 2, 3])
    assert [m["channel"] for m in linh.of_type("message.created")] == [str(fleet.id)] * 3
    assert linh.of_type("error") == []


@pytest.mark.parametrize("position", [3, 10])
async def test_a_cursor_at_or_beyond_the_last_seq_backfills_nothing_and_drops_no_live_message(acme, position, closing):
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 3)

    linh = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): position})))
    await linh.send_and_ack(send_payload(fleet, "live"))

    # seq 4 is at or below a stale position of 10, and must still arrive.
    await linh.wait_for(lambda s: s.seqs() == [4])


async def test_a_long_history_is_read_page_by_page_in_order(acme, monkeypatch, closing):
    monkeypatch.setattr(handlers, "PAGE_SIZE", 7)
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 30)
    reads: list[int] = []
    real_read_page = handlers.read_page

    async def counted(*args):
        page = await real_read_page(*args)
        reads.append(len(page))
        return page

    monkeypatch.setattr(handlers, "read_page", counted)

    linh = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): 1})))

    await linh.wait_for(lambda s: s.seqs() == list(range(2, 31)))
    assert reads == [7, 7, 7, 7, 1]


async def test_a_message_published_during_the_backfill_is_held_and_sent_after_it(
    acme, monkeypatch, chat_states, closing
):
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 5)
    tuan = await closing(Socket.open(acme.token("tuan")))
    real_read_page = handlers.read_page

    async def with_a_live_message_meanwhile(*args):
        page = await real_read_page(*args)
        # Between the read and its sends, tuan posts seq 6 and it reaches linh live.
        await tuan.send_and_ack(send_payload(fleet, "during the backfill"))
        await until(lambda: chat_states[-1].held.get(str(fleet.id)))
        return page

    monkeypatch.setattr(handlers, "read_page", with_a_live_message_meanwhile)

    linh = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): 0})))

    await linh.wait_for(lambda s: len(s.seqs()) >= 6)
    assert linh.seqs() == [1, 2, 3, 4, 5, 6]
    assert chat_states[-1].held == {}
    await tuan.send_and_ack(send_payload(fleet, "after the backfill"))
    await linh.wait_for(lambda s: s.seqs() == [1, 2, 3, 4, 5, 6, 7])


async def test_a_message_the_backfill_already_sent_is_not_sent_again_when_its_live_copy_arrives(
    acme, monkeypatch, chat_states, closing
):
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 2)
    real_read_last_seq = handlers.read_last_seq
    late: list[dict] = []

    async def stored_just_before_the_read(channel_id):
        # seq 3 commits before the backfill looks, and its publish comes later: the
        # backfill sends it, so both live copies below must be dropped.
        result = await database_sync_to_async(send_message)(acme.users["tuan"], channel_id, "late", "late one")
        late.append(result.message)
        return await real_read_last_seq(channel_id)

    monkeypatch.setattr(handlers, "read_last_seq", stored_just_before_the_read)
    real_read_page = handlers.read_page

    async def copy_published_while_held(*args):
        await get_channel_layer().group_send(chat_group(str(fleet.id)), {"type": "message.created", "message": late[0]})
        await until(lambda: chat_states[-1].held.get(str(fleet.id)))
        return await real_read_page(*args)

    monkeypatch.setattr(handlers, "read_page", copy_published_while_held)

    linh = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): 0})))
    await linh.wait_for(lambda s: s.seqs() == [1, 2, 3])
    await until(lambda: str(fleet.id) not in chat_states[-1].held)
    # And a copy arriving after the backfill finished (a slow publisher) is dropped too.
    await get_channel_layer().group_send(chat_group(str(fleet.id)), {"type": "message.created", "message": late[0]})
    tuan = await closing(Socket.open(acme.token("tuan")))
    await tuan.send_and_ack(send_payload(fleet, "next"))

    await linh.wait_for(lambda s: len(s.seqs()) >= 4)
    assert linh.seqs() == [1, 2, 3, 4]


async def test_other_channels_flow_while_a_backfill_is_stalled(acme, monkeypatch, closing):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 3)
    release = asyncio.Event()
    real_read_page = handlers.read_page

    async def stalled(*args):
        await release.wait()
        return await real_read_page(*args)

    monkeypatch.setattr(handlers, "read_page", stalled)

    linh = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): 0})))
    tuan = await closing(Socket.open(acme.token("tuan")))
    await tuan.send_and_ack(send_payload(general, "not held back"))
    await tuan.send_and_ack(send_payload(fleet, "held until the backfill is done"))

    await linh.wait_for(lambda s: s.seqs(general) == [1])
    assert linh.seqs(fleet) == []
    release.set()
    await linh.wait_for(lambda s: s.seqs(fleet) == [1, 2, 3, 4])


async def test_a_failed_backfill_says_so_and_closes_so_the_client_resumes_again(acme, monkeypatch, caplog, closing):
    fleet = acme.channels["fleet"]
    await database_sync_to_async(store_history)(fleet, acme.users["tuan"], 3)

    async def broken(*args):
        raise DatabaseError("disk I/O error")

    monkeypatch.setattr(handlers, "read_page", broken)
    linh = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): 0})))

    error = await linh.next_of("error")
    await linh.wait_for(lambda s: s.close_code is not None)

    assert error["code"] == "resume_failed"
    assert linh.close_code == close_codes.RESUME_FAILED
    assert linh.seqs() == []
    failures = [r for r in caplog.records if r.getMessage() == "message.resume_failed"]
    assert [r.levelno for r in failures] == [logging.ERROR]

    monkeypatch.undo()
    again = await closing(Socket.open(acme.token("linh"), cursor(**{str(fleet.id): 0})))
    await again.wait_for(lambda s: s.seqs() == [1, 2, 3])
