"""No token reaches a log line: a live instance's whole output, Daphne's access log included, is grepped.

Linh connects and talks, a stranger's forged and unknown-user tokens are refused, and a client
sends a token in a plain HTTP request's query string: none of those tokens may be in the output.
"""

import pytest

from relay.transport.daphne_server import WithoutQueryStrings
from tests.chat_helpers import send_payload
from tests.support import WAIT, WsClient, connect, status_of, timings


def secrets_in(text: str, tokens: list[str]) -> list[str]:
    """Which of `tokens` (or their signatures, the part that makes them credentials) appear in `text`."""
    return [token for token in tokens if token in text or token.rsplit(".", 1)[-1] in text]


def test_the_access_logger_drops_query_strings_and_keeps_the_rest():
    lines = []
    log = WithoutQueryStrings(lambda protocol, action, details: lines.append((protocol, action, details)))
    log("websocket", "connecting", {"path": "/v1/ws?token=abc.def.ghi", "client": ["127.0.0.1", 5]})
    log("http", "complete", {"path": "/v1/channels", "status": 200})
    assert lines == [
        ("websocket", "connecting", {"path": "/v1/ws", "client": ["127.0.0.1", 5]}),
        ("http", "complete", {"path": "/v1/channels", "status": 200}),
    ]


@pytest.mark.live
@pytest.mark.parametrize("verbosity", ["1", "2"])
async def test_a_live_instance_writes_no_token_anywhere(acme, live_instances, verbosity, closing):
    (gw,) = live_instances(1, args=("-v", verbosity), **timings())
    token = acme.token("linh")
    linh = await closing(WsClient.open(gw.ws_url(token)))
    await linh.next_of("presence.snapshot")
    ack = await linh.send_and_ack(send_payload(acme.channels["fleet"], "hello"))
    assert ack["type"] == "message.ack"
    unknown_user = acme.token("nobody")
    forged = token.rsplit(".", 1)[0] + ".Zm9yZ2VkLXNpZ25hdHVyZS10aGF0LWlzLWxvbmc"
    for refused_token in (unknown_user, forged):
        refused = await closing(WsClient.open(gw.ws_url(refused_token)))
        assert await refused.closed(WAIT) == 4401
    # A client that sends its token over plain HTTP, not as an upgrade, and as a reader's Bearer.
    plain = acme.token("tuan")
    assert status_of(f"{gw.http_url}/v1/ws?token={plain}") >= 400
    fleet = acme.channels["fleet"].id
    assert status_of(f"{gw.http_url}/v1/channels/{fleet}/messages?token={plain}", bearer=plain) == 200
    await linh.close()
    tuan = await closing(connect(gw, acme, "tuan"))
    await tuan.close()
    gw.stop()
    output = gw.log_path.read_text()
    # The access log was on, and so were Relay's own lines: there was something to leak into.
    assert "WSCONNECT /v1/ws" in output
    assert "GET /v1/ws" in output
    assert f"GET /v1/channels/{fleet}/messages" in output
    assert [line["user"] for line in gw.events("connection.opened")] == ["linh", "tuan"]
    assert secrets_in(output, [token, unknown_user, forged, plain]) == []
