"""The WebSocket consumer: authenticate, acknowledge, answer bad frames, route good ones."""

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from channels.testing import WebsocketCommunicator
from pydantic import BaseModel, ConfigDict

from relay import registry
from relay.asgi import application
from relay.close_codes import UNAUTHORIZED
from relay.exceptions import ConnectionRefused
from relay.layer import channel_layer
from relay.logging import event_fields
from relay.tokens import mint_token
from tests.support import events, next_frame, open_communicator

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_valid_token_gets_connection_ack_with_the_users_channels(acme):
    communicator = await open_communicator(acme.token("linh"))
    ack = await next_frame(communicator)
    assert ack["type"] == "connection.ack"
    assert ack["payload"]["user"] == "linh"
    assert set(ack["payload"]["channels"]) == {str(acme.channels["fleet"].id), str(acme.channels["general"].id)}
    assert ack["payload"]["connection_id"]
    await communicator.disconnect()


async def test_a_user_of_no_channel_is_acknowledged_with_none(acme):
    communicator = await open_communicator(acme.token("hermit"))
    assert (await next_frame(communicator))["payload"]["channels"] == []
    await communicator.disconnect()


async def assert_closed_4401(communicator: WebsocketCommunicator) -> None:
    output = await communicator.receive_output(timeout=3)
    assert output == {"type": "websocket.close", "code": UNAUTHORIZED}
    assert await communicator.receive_nothing(timeout=0.1)


@pytest.mark.parametrize("token", [None, "", "garbage", "a.b.c"])
async def test_missing_or_malformed_tokens_are_closed_4401(acme, token):
    communicator = await open_communicator(token)  # accepted (asserted there), so that a browser sees the code
    await assert_closed_4401(communicator)
    good = await open_communicator(acme.token("linh"))
    assert (await next_frame(good))["type"] == "connection.ack"
    await good.disconnect()


async def test_an_expired_token_is_closed_4401(acme):
    token, _ = mint_token(acme.environment, "linh", 60, now=datetime.now(UTC) - timedelta(hours=2))
    communicator = await open_communicator(token)
    await assert_closed_4401(communicator)


async def test_another_tenants_token_for_a_user_it_does_not_have_is_closed_4401(acme, globex):
    communicator = await open_communicator(acme.token("zed"))
    await assert_closed_4401(communicator)
    own = await open_communicator(globex.token("zed"))
    assert (await next_frame(own))["payload"]["user"] == "zed"
    await own.disconnect()


async def test_a_forged_signature_is_closed_4401(acme):
    header, claims, _ = acme.token("linh").split(".")
    communicator = await open_communicator(f"{header}.{claims}.AAAA")
    await assert_closed_4401(communicator)


@pytest.mark.parametrize(
    ("raw", "message_part"),
    [
        ("not json", "not valid JSON"),
        ("[]", "Input should be"),
        ('{"type": "message.send"}', "payload"),
        ('{"type": "nope", "payload": {}}', "unknown frame type"),
        ('{"type": "presence.changed", "payload": {"user": "linh", "state": "online"}}', "unknown frame type"),
        ('{"type": "connection.ack", "payload": {}}', "unknown frame type"),
        ('{"type": 5, "payload": {}}', "type"),
        ('{"type": "x", "payload": {}, "extra": 1}', "extra"),
    ],
)
async def test_a_malformed_frame_gets_an_error_and_the_socket_stays_open(acme, raw, message_part):
    communicator = await open_communicator(acme.token("linh"))
    await next_frame(communicator)
    await communicator.send_to(text_data=raw)
    error = await next_frame(communicator)
    assert error["type"] == "error"
    assert error["payload"]["code"] == "invalid_frame"
    assert message_part in error["payload"]["message"]
    # Still open: a second bad frame is answered too.
    await communicator.send_to(text_data="still not json")
    assert (await next_frame(communicator))["payload"]["code"] == "invalid_frame"
    await communicator.disconnect()


async def test_a_binary_frame_gets_an_error(acme):
    communicator = await open_communicator(acme.token("linh"))
    await next_frame(communicator)
    await communicator.send_to(bytes_data=b"\x00\x01")
    assert (await next_frame(communicator))["payload"]["code"] == "invalid_frame"
    await communicator.disconnect()


class Echo(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    word: str


@pytest.fixture
def echo_family():
    """A frame family registered the way an app registers one, removed afterwards."""

    @registry.frame("test.echo", Echo, error_code="invalid_payload")
    async def echo(conn, payload: Echo) -> None:
        await conn.send_frame("test.echoed", {"word": payload.word, "user": conn.user_id})

    yield
    del registry.frames["test.echo"]


async def test_a_registered_frame_type_is_routed_to_its_handler(acme, echo_family):
    communicator = await open_communicator(acme.token("linh"))
    await next_frame(communicator)
    await communicator.send_to(text_data=json.dumps({"type": "test.echo", "payload": {"word": "hi"}}))
    assert await next_frame(communicator) == {"type": "test.echoed", "payload": {"word": "hi", "user": "linh"}}
    await communicator.send_to(text_data=json.dumps({"type": "test.echo", "payload": {"word": 3}}))
    error = await next_frame(communicator)
    assert error["payload"]["code"] == "invalid_payload"
    assert error["payload"]["type"] == "test.echo"
    await communicator.disconnect()


async def test_opening_and_closing_are_logged_without_the_token(acme, caplog):
    token = acme.token("linh")
    communicator = await open_communicator(token)
    ack = (await next_frame(communicator))["payload"]
    await communicator.disconnect()
    logged = {r.getMessage(): event_fields(r) for r in caplog.records if r.name == "relay.consumers"}
    assert logged["connection.opened"] == {"connection_id": ack["connection_id"], "user": "linh"}
    assert logged["connection.closed"] == {"connection_id": ack["connection_id"], "user": "linh"}
    assert token not in caplog.text


async def test_a_refused_connection_logs_nothing_as_opened(acme, caplog):
    communicator = await open_communicator("garbage")
    await assert_closed_4401(communicator)
    ok = await open_communicator(acme.token("tuan"))
    await next_frame(ok)
    await ok.disconnect()
    opened = [e["user"] for e in events(caplog, "connection.opened")]
    assert opened == ["tuan"]


@pytest.mark.usefixtures("close_presence_service")
async def test_a_closed_consumers_channel_is_forgotten_though_a_message_arrived_as_it_left(acme):
    fleet = str(acme.channels["fleet"].id)
    layer = channel_layer()
    watcher = await open_communicator(acme.token("tuan"))
    await next_frame(watcher)
    before = set(layer._get_layer().channels)
    for _ in range(20):
        communicator = await open_communicator(acme.token("linh"))
        await next_frame(communicator)
        [channel] = set(layer._get_layer().channels) - before
        # Used while connected: a message put on the channel reaches the client.
        signal = {"type": "signal.sent", "channel": fleet, "user": "tuan", "name": "typing", "data": {}}
        assert layer.send_local(channel, signal)
        assert (await next_frame(communicator))["type"] == "signal"
        # A message lands on the queue in the same turn as the close: the consumer stops on the
        # close with that message received but never handled.
        assert layer.send_local(channel, {**signal, "user": "linh"})
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        assert not layer.send_local(channel, signal)
        assert layer.backlog(channel) == 0
    assert set(layer._get_layer().channels) == before
    await watcher.disconnect()


async def test_an_event_taken_off_the_layer_by_a_connection_refused_while_connecting_reaches_no_handler(acme):
    # An app refuses the connection after its groups were joined, and a message stored in one of
    # its channels meanwhile was already received: chat never admitted it (no state of its own),
    # and handling the event anyway ended the application with an exception.
    fleet = str(acme.channels["fleet"].id)
    created = {
        "type": "message.created",
        "message": {
            "id": "m",
            "channel": fleet,
            "seq": 1,
            "user": "tuan",
            "text": "hi",
            "created_at": "2026-01-01T00:00:00+00:00",
        },
    }

    class Refusing(registry.Extension):
        order = -1  # before every app: the event is the first the connection receives

        async def admit(self, conn) -> None:
            if conn.user_id == "linh":
                assert channel_layer().send_local(conn.channel_name, created)
                await asyncio.sleep(0.05)  # the consumer's receive takes it off the queue
                raise ConnectionRefused(4403, "refused by the test")

    refusing = registry.extension(Refusing())
    try:
        refused = WebsocketCommunicator(application, f"/v1/ws?token={acme.token('linh')}")
        assert (await refused.connect(timeout=5))[0]
        assert (await refused.receive_output(timeout=5)) == {"type": "websocket.close", "code": 4403}
        await refused.send_input({"type": "websocket.disconnect", "code": 1000})
        await refused.wait(timeout=5)
        # The same event reaches an admitted connection's handler.
        before = set(channel_layer()._get_layer().channels)
        tuan = await open_communicator(acme.token("tuan"))
        await next_frame(tuan)
        [channel] = set(channel_layer()._get_layer().channels) - before
        assert channel_layer().send_local(channel, created)
        assert await next_frame(tuan) == {"type": "message.created", "payload": created["message"]}
        await tuan.disconnect()
    finally:
        registry.extensions.remove(refusing)
