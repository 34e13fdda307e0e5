"""The foundation end to end: real Daphne processes, real sockets, one Redis and one database."""

import contextlib
import logging
import socket
import time

import pytest
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from relay.close_handshake import CLOSE_HANDSHAKE_TIMEOUT_S
from relay.serve import _lean_log_records, _quiet_autobahn_debug, daphne_arguments
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


async def test_a_real_socket_is_acknowledged_and_a_bad_token_closed_4401(live_instances, acme):
    (instance,) = live_instances(1)
    token = acme.token("linh")
    client = await WsClient.open(instance.ws_url(token))
    ack = await client.next_of("connection.ack")
    assert ack["user"] == "linh"
    await client.send_raw("nonsense")
    assert (await client.next_of("error"))["code"] == "invalid_frame"
    await client.close()

    refused = await WsClient.open(instance.ws_url("forged"))
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
    yet handled the close frame then reports 1006 and retries (relay/close_handshake.py). Both
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


def test_a_peer_gets_ten_seconds_to_answer_a_close():
    assert CLOSE_HANDSHAKE_TIMEOUT_S == 10.0


def test_daphne_runs_quiet_unless_a_verbosity_is_asked_for():
    assert daphne_arguments(["-p", "8000", "relay.asgi:application"]) == [
        "--verbosity",
        "0",
        "-p",
        "8000",
        "relay.asgi:application",
    ]
    assert daphne_arguments(["-v", "1", "relay.asgi:application"]) == ["-v", "1", "relay.asgi:application"]
    assert daphne_arguments(["--verbosity=2", "x:app"]) == ["--verbosity=2", "x:app"]


def test_relay_serve_leaves_out_of_log_records_what_no_formatter_shows(monkeypatch):
    for switch in ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile"):
        monkeypatch.setattr(logging, switch, getattr(logging, switch))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("relay.tests.lean")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(logger, "propagate", False)
    try:
        logger.info("before")
        _lean_log_records()
        logger.info("after")
    finally:
        logger.removeHandler(handler)
    before, after = records
    assert (before.funcName, before.threadName) == (
        "test_relay_serve_leaves_out_of_log_records_what_no_formatter_shows",
        "MainThread",
    )
    assert (after.funcName, after.threadName, after.processName) == ("(unknown function)", None, None)


def test_relay_serve_skips_the_formatting_of_autobahn_debug_arguments(monkeypatch):
    import autobahn.twisted.websocket
    import autobahn.util
    import autobahn.websocket.protocol

    modules = (autobahn.websocket.protocol, autobahn.twisted.websocket)
    for module in modules:
        for name in ("hltype", "hlval"):
            monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(autobahn.websocket.protocol, "pformat", autobahn.websocket.protocol.pformat)
    monkeypatch.setattr(autobahn.util, "_HAS_CLICK", autobahn.util._HAS_CLICK)
    method = daphne_arguments
    # autobahn's own: the method's qualified name taken apart and put together again, as text.
    built = autobahn.websocket.protocol.hltype(method)
    assert isinstance(built, str) and "relay" in built and "daphne_arguments" in built
    assert "42" in autobahn.twisted.websocket.hlval(42)
    _quiet_autobahn_debug()
    for module in modules:
        assert module.hltype(method) is method
        assert module.hlval(42, color="white", bold=True) == 42
    assert "not formatted" in autobahn.websocket.protocol.pformat({"setting": 1})
