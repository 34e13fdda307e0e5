"""relay_client against a scripted server doing what a real Relay never does (tests/scripted_relay.py).

Junk frames, close codes on cue, a connection cut between a send and its ack, a history endpoint
that fails, a token callable that changes user: none of it may crash the client, lose a message,
repeat one, or make a send land twice.
"""

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable

import pytest
from relay_client import (
    Client,
    ConnectFailed,
    Error,
    MessageCreated,
    PresenceChanged,
    Reconnected,
    SendRefused,
    Unauthorized,
    UserChanged,
)

from tests.client_helpers import Application
from tests.scripted_relay import Connection, ScriptedRelay, message

CHANNEL = "0b9e3c55-1d1f-4d9a-9a50-4cbb8d5ad001"
FAST = {"retry_base": 0.05, "retry_cap": 0.2}


def reader(url: str, token: object = "t", **options) -> Client:
    """linh's client, starting from seq 0 of CHANNEL (so the history is read only for a gap)."""
    return Client(url, token, cursor={CHANNEL: 0}, **{**FAST, **options})


async def test_junk_frames_are_ignored_and_the_frames_around_them_still_count(caplog):
    junk: list[str | bytes] = [
        json.dumps({"type": "presence.teleported", "payload": {"user": "tuan"}}),
        "not json {",
        b"\x00binary",
        json.dumps(["a", "list"]),
        json.dumps({"type": 5, "payload": {}}),
        json.dumps({"type": "message.created", "payload": None}),
        json.dumps({"type": "message.created", "payload": {"id": "m", "channel": CHANNEL, "seq": 1}}),
        json.dumps({"type": "message.created", "payload": {**message(CHANNEL, 1), "seq": "1"}}),
        json.dumps({"type": "message.created", "payload": {**message(CHANNEL, 1), "seq": True}}),
        json.dumps({"type": "presence.changed", "payload": {"user": "tuan", "state": "away"}}),
        json.dumps({"type": "presence.snapshot", "payload": {"online": "everyone"}}),
        json.dumps({"type": "message.ack", "payload": {"idem_key": "k", "channel": CHANNEL}}),
        json.dumps({"type": "error", "payload": {"message": "no code"}}),
        json.dumps({"type": "connection.ack", "payload": {"connection_id": "x", "user": "mallory", "channels": []}}),
    ]

    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], ["linh"])
        for frame in junk:
            await connection.send_raw(frame)
        await connection.send("presence.changed", {"user": "tuan", "state": "online"})
        # A field the contract does not name yet is ignored, not refused: the server may add some.
        await connection.send("message.created", {**message(CHANNEL, 1), "reactions": []})
        await connection.drain()

    async with ScriptedRelay(script) as server:
        client = reader(server.url)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: app.messages())
        assert app.events == [PresenceChanged(user="tuan", state="online"), MessageCreated(**message(CHANNEL, 1))]
        assert client.online == {"linh", "tuan"} and client.user == "linh" and client.connected
        assert len(server.connections) == 1
        await client.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "relay_client" and r.levelno == logging.WARNING]
    assert len(warnings) == len(junk) - 1  # the unknown type is skipped quietly
    assert all("message 1" not in line for line in warnings)


async def test_a_server_that_never_acknowledges_fails_the_connect():
    async def silent(connection: Connection) -> None:
        await connection.send_raw("{}")
        await connection.drain()

    async def acknowledges(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        await connection.drain()

    async with ScriptedRelay(silent) as server:
        with pytest.raises(ConnectFailed):
            await asyncio.wait_for(reader(server.url, open_timeout=0.5).connect(), 30)
    async with ScriptedRelay(acknowledges) as server:
        client = reader(server.url, open_timeout=0.5)
        await asyncio.wait_for(client.connect(), 30)
        assert client.connected
        await client.close()


async def test_a_failed_connect_names_the_server_but_never_the_token(caplog):
    caplog.set_level(logging.DEBUG, logger="relay_client")
    with pytest.raises(ConnectFailed) as failed:
        await asyncio.wait_for(Client("ws://127.0.0.1:9", "s3cret-token").connect(), 30)
    assert "127.0.0.1:9" in str(failed.value)
    assert "s3cret" not in str(failed.value) and "s3cret" not in repr(failed.value.__cause__)
    assert all("s3cret" not in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("code", [4008, 1011, 1001, 1000, None], ids=["4008", "1011", "1001", "1000", "dropped"])
async def test_any_close_but_a_refusal_is_followed_by_a_reconnect(code):
    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], ["linh", "tuan"])
        if len(server.connections) == 1:
            await connection.send("message.created", message(CHANNEL, 1))
            if code is None:
                connection.socket.transport.abort()
            else:
                await connection.socket.close(code)
            return
        await connection.drain()

    async with ScriptedRelay(script) as server:
        client = reader(server.url)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: app.reconnects())
        assert app.disconnects() == [code or 1006]
        assert server.connections[1].cursor == {CHANNEL: 1}
        assert client.connected
        await client.close()


async def test_a_refusal_after_the_connect_stops_a_client_with_a_fixed_token():
    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        await connection.socket.close(4401)

    async with ScriptedRelay(script) as server:
        client = reader(server.url)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.finished()
        assert isinstance(app.stopped_by, Unauthorized)
        assert app.disconnects() == [4401]
        assert len(server.connections) == 1


async def test_a_token_for_another_user_on_reconnect_stops_the_client():
    users = iter(["linh", "tuan"])

    async def script(connection: Connection) -> None:
        await connection.hello(next(users), [CHANNEL], [])
        await connection.socket.close(1011)

    async with ScriptedRelay(script) as server:
        client = reader(server.url, lambda: "t")
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.finished()
        assert isinstance(app.stopped_by, UserChanged)
        assert (app.stopped_by.expected, app.stopped_by.got) == ("linh", "tuan")


async def test_a_send_cut_off_before_its_ack_goes_again_with_the_same_idem_key():
    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        frame = await connection.next_frame()
        if len(server.connections) == 1:
            connection.socket.transport.abort()  # stored, say, but the ack is lost with the connection
            return
        payload = frame["payload"]
        ack = {"idem_key": payload["idem_key"], "id": "m-1", "channel": payload["channel"], "seq": 1}
        await connection.send("message.ack", ack)
        await connection.drain()

    async with ScriptedRelay(script) as server:
        client = reader(server.url)
        await asyncio.wait_for(client.connect(), 30)
        ack = await asyncio.wait_for(client.send(CHANNEL.upper(), "once"), 15)
        assert (ack.channel, ack.seq) == (CHANNEL, 1)
        first, second = (connection.received[0] for connection in server.connections)
        assert (
            first
            == second
            == {"type": "message.send", "payload": {"idem_key": ack.idem_key, "channel": CHANNEL, "text": "once"}}
        )
        await client.close()


async def test_an_error_answers_the_oldest_send_in_flight_and_other_errors_are_events():
    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        first = await connection.next_frame()
        second = await connection.next_frame()
        await connection.send("error", {"code": "not_a_member", "message": "no", "type": "message.send"})
        await connection.send("error", {"code": "internal", "message": "oops", "type": "heartbeat"})
        payload = second["payload"]
        ack = {"idem_key": payload["idem_key"], "id": "m-1", "channel": CHANNEL, "seq": 1}
        await connection.send("message.ack", ack)
        assert first["payload"]["text"] == "refused"
        await connection.drain()

    async with ScriptedRelay(script) as server:
        client = reader(server.url)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        refused = asyncio.create_task(client.send(CHANNEL, "refused"))
        await asyncio.sleep(0.05)
        accepted = asyncio.create_task(client.send(CHANNEL, "accepted"))
        with pytest.raises(SendRefused, match="not_a_member"):
            await refused
        assert (await accepted).seq == 1
        await app.until(lambda app: app.events)
        assert app.events == [Error(code="internal", message="oops", type="heartbeat")]
        await client.close()


async def test_the_cursor_holds_the_highest_contiguous_seq_not_the_highest_seen():
    delivered_one = asyncio.Event()

    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        if len(server.connections) == 1:
            await connection.send("message.created", message(CHANNEL, 1))
            await connection.send("message.created", message(CHANNEL, 3))
            await delivered_one.wait()
            await connection.socket.close(4008)
            return
        for seq in (2, 3, 4):  # the resume, then a live one
            await connection.send("message.created", message(CHANNEL, seq))
        await connection.drain()

    async with ScriptedRelay(script) as server:
        client = reader(server.url, gap_wait=60)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: app.messages())
        await asyncio.sleep(0.1)
        assert app.seqs() == [1] and client.cursor == {CHANNEL: 1}
        delivered_one.set()
        await app.until(lambda app: len(app.seqs()) == 4)
        assert app.seqs() == [1, 2, 3, 4]
        assert server.connections[1].cursor == {CHANNEL: 1}
        assert server.history_requests == []
        await client.close()


async def test_a_late_frame_closes_its_gap_without_the_history_and_a_missing_one_is_read_from_it():
    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        for seq in (2, 1):  # merely late
            await connection.send("message.created", message(CHANNEL, seq))
        await asyncio.sleep(0.5)
        await connection.send("message.created", message(CHANNEL, 5))  # 3 and 4 never come live
        await connection.drain()

    async with ScriptedRelay(script, history={CHANNEL: [message(CHANNEL, seq) for seq in range(1, 6)]}) as server:
        client = reader(server.url, gap_wait=0.2)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: len(app.seqs()) == 5)
        assert app.seqs() == [1, 2, 3, 4, 5]
        assert len(server.history_requests) == 1
        assert "after=2&limit=2" in server.history_requests[0]
        assert server.history_headers[0]["Authorization"] == "Bearer t"
        assert app.reconnects() == 0
        await client.close()


async def test_when_the_history_cannot_be_read_a_resume_fills_the_gap():
    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        if len(server.connections) == 1:
            await connection.send("message.created", message(CHANNEL, 1))
            await connection.send("message.created", message(CHANNEL, 3))
        else:
            for seq in range(connection.cursor[CHANNEL] + 1, 4):
                await connection.send("message.created", message(CHANNEL, seq))
        await connection.drain()

    async with ScriptedRelay(script, history_status=500) as server:
        client = reader(server.url, gap_wait=0.05)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: len(app.seqs()) == 3)
        assert app.seqs() == [1, 2, 3]
        assert len(server.history_requests) == 1
        assert server.connections[1].cursor == {CHANNEL: 1}
        assert app.reconnects() == 1
        await client.close()


def gap_then_resume(server_of: Callable[[], ScriptedRelay]) -> Callable[[Connection], Awaitable[None]]:
    """Seq 1 and 3 live on the first connection (2 is missing); a resume sends the rest."""

    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        if len(server_of().connections) == 1:
            await connection.send("message.created", message(CHANNEL, 1))
            await connection.send("message.created", message(CHANNEL, 3))
        else:
            for seq in range(connection.cursor[CHANNEL] + 1, 4):
                await connection.send("message.created", message(CHANNEL, seq))
        await connection.drain()

    return script


async def test_a_history_that_redirects_is_not_followed_with_the_token():
    history = {CHANNEL: [message(CHANNEL, seq) for seq in range(1, 4)]}
    async with (
        ScriptedRelay(gap_then_resume(lambda: elsewhere), history=history) as elsewhere,
        ScriptedRelay(gap_then_resume(lambda: server), history_redirect=elsewhere.http_url) as server,
    ):
        client = reader(server.url, gap_wait=0.05)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: len(app.seqs()) == 3)
        assert app.seqs() == [1, 2, 3]  # from the resume
        assert len(server.history_requests) == 1
        assert app.reconnects() == 1
        assert elsewhere.history_requests == []  # the token never went there
        await client.close()


async def test_a_history_page_larger_than_its_messages_can_be_is_not_read():
    history = {CHANNEL: [message(CHANNEL, seq) for seq in range(1, 4)]}
    async with ScriptedRelay(gap_then_resume(lambda: server), history=history, history_padding=2**22) as server:
        client = reader(server.url, gap_wait=0.05)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: len(app.seqs()) == 3)
        assert app.seqs() == [1, 2, 3]  # from the resume: the page of one message was 4 MiB
        assert len(server.history_requests) == 1
        assert app.reconnects() == 1
        await client.close()


async def test_a_channel_the_first_connection_does_not_know_yet_is_read_from_its_start():
    other = "0b9e3c55-1d1f-4d9a-9a50-4cbb8d5ad002"

    async def script(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], [])
        await connection.send("message.created", message(other, 3))  # joined while connected
        await connection.drain()

    history = {other: [message(other, seq) for seq in (1, 2, 3)]}
    async with ScriptedRelay(script, history=history) as server:
        client = reader(server.url, gap_wait=0.05)
        await asyncio.wait_for(client.connect(), 30)
        app = Application(client)
        await app.until(lambda app: len(app.seqs(other)) == 3)
        assert app.seqs(other) == [1, 2, 3] and app.seqs(CHANNEL) == []
        assert client.cursor == {CHANNEL: 0, other: 3}
        assert not [event for event in app.events if isinstance(event, Reconnected)]
        await client.close()


async def test_a_server_that_acknowledges_then_closes_is_retried_ever_more_slowly():
    opened: list[float] = []

    async def ack_then_close(connection: Connection) -> None:
        opened.append(asyncio.get_running_loop().time())
        await connection.hello("linh", [CHANNEL], ["linh"])
        await connection.socket.close(1011, "resume_failed")

    base = 0.02
    async with ScriptedRelay(ack_then_close) as server:
        client = reader(server.url, retry_base=base, retry_cap=10.0)
        await asyncio.wait_for(client.connect(), 30)
        await server.connection(6)
        await client.close()
    gaps = [later - earlier for earlier, later in itertools.pairwise(opened)]
    # Each wait is at least half its ceiling, and the ceiling doubles: an acknowledgement alone
    # does not count as the connection having worked.
    for failures, gap in enumerate(gaps[:6]):
        assert gap >= base * 2**failures / 2, (failures, gaps)


async def test_a_send_refused_rate_limited_goes_again_after_the_wait_and_lands_once():
    async def limit_the_first(connection: Connection) -> None:
        await connection.hello("linh", [CHANNEL], ["linh"])
        first = await connection.next_frame()
        await connection.send("error", {"code": "rate_limited", "message": "slow down", "retry_after_ms": 50})
        again = await connection.next_frame()
        assert again == first
        payload = again["payload"]
        ack = {"idem_key": payload["idem_key"], "id": "m-1", "channel": CHANNEL, "seq": 1}
        await connection.send("message.ack", ack)
        await connection.drain()

    async with ScriptedRelay(limit_the_first) as server:
        client = reader(server.url)
        await asyncio.wait_for(client.connect(), 30)
        ack = await asyncio.wait_for(client.send(CHANNEL, "hello"), 30)
        assert (ack.seq, ack.channel) == (1, CHANNEL)
        assert [frame["type"] for frame in server.connections[0].received] == ["message.send", "message.send"]
        assert len(server.connections) == 1
        await client.close()
