"""The WebSocket consumer: authenticate, acknowledge, answer bad frames, route good ones."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from channels.testing import WebsocketCommunicator
from pydantic import BaseModel, ConfigDict

from relay import registry
from relay.asgi import application
from relay.consumers import CLOSE_UNAUTHORIZED
from relay.logging import event_fields
from relay.tokens import mint_token
from tests.support import next_frame

pytestmark = pytest.mark.django_db(transaction=True)


async def connect(token: str | None, query: str = "") -> tuple[WebsocketCommunicator, bool]:
    path = "/v1/ws" + (f"?token={token}" if token is not None else "") + query
    communicator = WebsocketCommunicator(application, path)
    connected, _ = await communicator.connect()
    return communicator, connected


async def frame(communicator: WebsocketCommunicator) -> dict:
    """The next frame that is not presence's (the snapshot and transitions have their own tests)."""
    return await next_frame(communicator)


async def test_a_valid_token_gets_connection_ack_with_the_users_channels(acme):
    communicator, connected = await connect(acme.token("linh"))
    assert connected
    ack = await frame(communicator)
    assert ack["type"] == "connection.ack"
    assert ack["payload"]["user"] == "linh"
    assert set(ack["payload"]["channels"]) == {str(acme.channels["fleet"].id), str(acme.channels["general"].id)}
    assert ack["payload"]["connection_id"]
    await communicator.disconnect()


async def test_a_user_of_no_channel_is_acknowledged_with_none(acme):
    communicator, _ = await connect(acme.token("hermit"))
    assert (await frame(communicator))["payload"]["channels"] == []
    await communicator.disconnect()


async def assert_closed_4401(communicator: WebsocketCommunicator) -> None:
    output = await communicator.receive_output(timeout=3)
    assert output == {"type": "websocket.close", "code": CLOSE_UNAUTHORIZED}
    assert await communicator.receive_nothing(timeout=0.1)


@pytest.mark.parametrize("token", [None, "", "garbage", "a.b.c"])
async def test_missing_or_malformed_tokens_are_closed_4401(acme, token):
    communicator, connected = await connect(token)
    assert connected  # accepted, so that a browser sees the code
    await assert_closed_4401(communicator)
    good, _ = await connect(acme.token("linh"))
    assert (await frame(good))["type"] == "connection.ack"
    await good.disconnect()


async def test_an_expired_token_is_closed_4401(acme):
    token, _ = mint_token(acme.environment, "linh", 60, now=datetime.now(UTC) - timedelta(hours=2))
    communicator, _ = await connect(token)
    await assert_closed_4401(communicator)


async def test_another_tenants_token_for_a_user_it_does_not_have_is_closed_4401(acme, globex):
    communicator, _ = await connect(acme.token("zed"))
    await assert_closed_4401(communicator)
    own, _ = await connect(globex.token("zed"))
    assert (await frame(own))["payload"]["user"] == "zed"
    await own.disconnect()


async def test_a_forged_signature_is_closed_4401(acme):
    header, claims, _ = acme.token("linh").split(".")
    communicator, _ = await connect(f"{header}.{claims}.AAAA")
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
    communicator, _ = await connect(acme.token("linh"))
    await frame(communicator)
    await communicator.send_to(text_data=raw)
    error = await frame(communicator)
    assert error["type"] == "error"
    assert error["payload"]["code"] == "invalid_frame"
    assert message_part in error["payload"]["message"]
    # Still open: a second bad frame is answered too.
    await communicator.send_to(text_data="still not json")
    assert (await frame(communicator))["payload"]["code"] == "invalid_frame"
    await communicator.disconnect()


async def test_a_binary_frame_gets_an_error(acme):
    communicator, _ = await connect(acme.token("linh"))
    await frame(communicator)
    await communicator.send_to(bytes_data=b"\x00\x01")
    assert (await frame(communicator))["payload"]["code"] == "invalid_frame"
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
    communicator, _ = await connect(acme.token("linh"))
    await frame(communicator)
    await communicator.send_to(text_data=json.dumps({"type": "test.echo", "payload": {"word": "hi"}}))
    assert await frame(communicator) == {"type": "test.echoed", "payload": {"word": "hi", "user": "linh"}}
    await communicator.send_to(text_data=json.dumps({"type": "test.echo", "payload": {"word": 3}}))
    error = await frame(communicator)
    assert error["payload"]["code"] == "invalid_payload"
    assert error["payload"]["type"] == "test.echo"
    await communicator.disconnect()


async def test_opening_and_closing_are_logged_without_the_token(acme, caplog):
    token = acme.token("linh")
    communicator, _ = await connect(token)
    ack = (await frame(communicator))["payload"]
    await communicator.disconnect()
    events = {r.getMessage(): event_fields(r) for r in caplog.records if r.name == "relay.consumers"}
    assert events["connection.opened"] == {"connection_id": ack["connection_id"], "user": "linh"}
    assert events["connection.closed"] == {"connection_id": ack["connection_id"], "user": "linh"}
    assert token not in caplog.text


async def test_a_refused_connection_logs_nothing_as_opened(acme, caplog):
    communicator, _ = await connect("garbage")
    await assert_closed_4401(communicator)
    ok, _ = await connect(acme.token("tuan"))
    await frame(ok)
    await ok.disconnect()
    opened = [event_fields(r)["user"] for r in caplog.records if r.getMessage() == "connection.opened"]
    assert opened == ["tuan"]
