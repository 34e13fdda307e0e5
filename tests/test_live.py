"""The foundation end to end: real Daphne processes, real sockets, one Redis and one database."""

import pytest

from relay.serve import daphne_arguments
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
