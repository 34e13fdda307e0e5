"""The gateway end to end: health, the API, a socket's ack and refusal, and the close handshake.

On real Daphne processes with real sockets, one Redis and one database.
"""

import contextlib
import socket
import time

import pytest
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from tests.support import WsClient, http

pytestmark = pytest.mark.live


def test_two_instances_serve_health_and_the_api(live_instances, acme):
    one, two = live_instances(2)
    for instance in (one, two):
        assert http("GET", f"{instance.http_url}/healthz")[0] == 200
        assert http("GET", f"{instance.http_url}/readyz")[0] == 200
    status, body = http("POST", f"{one.http_url}/v1/users", {"id": "mai"}, acme.api_key)
    assert (status, body) == (201, {"id": "mai", "name": ""})
    # The other instance sees the same database at once.
    status, _ = http("POST", f"{two.http_url}/v1/tokens", {"user": "mai"}, acme.api_key)
    assert status == 201
    assert http("POST", f"{two.http_url}/v1/tokens", {"user": "mai"}, "rk_wrong")[0] == 401


async def test_a_real_socket_is_acknowledged_and_a_bad_token_closed_4401(live_instances, acme, closing):
    (instance,) = live_instances(1)
    token = acme.token("linh")
    client = await closing(WsClient.open(instance.ws_url(token)))
    ack = await client.next_of("connection.ack")
    assert ack["user"] == "linh"
    await client.send_raw("nonsense")
    assert (await client.next_of("error"))["code"] == "invalid_frame"
    await client.close()

    refused = await closing(WsClient.open(instance.ws_url("forged")))
    assert await refused.closed() == 4401
    assert refused.frames == []
    opened = instance.events("connection.opened")
    assert [line["user"] for line in opened] == ["linh"]
    assert token not in instance.log_path.read_text()
    # One JSON object per line: Daphne's plain-text access lines (WSCONNECT ...) stay off.
    lines = [line for line in instance.log_path.read_text().splitlines() if line.strip()]
    assert lines and all(line.startswith("{") and line.endswith("}") for line in lines), lines[:5]


@pytest.mark.parametrize("server", ["relay.serve", "daphne"])
def test_a_refused_client_slow_to_answer_the_close_is_waited_for(live_instances, server):
    """A browser busy loading the page answers Relay's 4401 late; the server must wait for it.

    autobahn's own wait is 1 s, after which it resets the connection, and a browser that has not
    yet handled the close frame then reports 1006 and retries (relay/transport/websocket_options.py). Both
    commands that serve Relay wait longer.
    """
    (instance,) = live_instances(1, server=server)
    client = ClientProtocol(parse_uri(instance.ws_url("forged")))
    with socket.create_connection(("127.0.0.1", instance.port), timeout=10) as sock:
        client.send_request(client.connect())
        sock.sendall(b"".join(client.data_to_send()))
        while client.close_rcvd is None:
            data = sock.recv(65536)
            assert data, "the server closed the TCP connection before sending a close frame"
            client.receive_data(data)
        assert client.close_rcvd.code == 4401
        # The client's answer is queued; it goes well past autobahn's own 1 s wait, and until then
        # the connection is still open and quiet: not reset, not closed.
        time.sleep(1.5)
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(1, socket.MSG_PEEK)
        sock.settimeout(10)
        sock.sendall(b"".join(client.data_to_send()))
        # Answered, the server ends the connection at once (autobahn always resets it then).
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(65536) == b""
