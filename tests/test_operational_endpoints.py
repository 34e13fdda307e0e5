"""/metrics is not public; /healthz and /readyz are, and name no tenant.

Who asks: Prometheus on the same host (loopback), a scraper elsewhere with RELAY_METRICS_TOKEN,
and a stranger on the network with neither.
"""

import contextlib
import socket

import pytest
from django.test import Client

from devtools.embedded_redis import free_port
from tests.support import http, status_of, timings

STRANGER = "203.0.113.7"
TOKEN = "scrape-me-0123456789abcdef"


def scrape(**extra: str) -> tuple[int, str]:
    response = Client().get("/metrics", **extra)
    return response.status_code, response.content.decode()


def test_without_a_token_only_loopback_clients_read_metrics(db, settings):
    settings.RELAY_METRICS_TOKEN = None
    status, body = scrape(REMOTE_ADDR="127.0.0.1")
    assert status == 200 and "relay_connections_open" in body
    assert scrape(REMOTE_ADDR="::1")[0] == 200
    status, body = scrape(REMOTE_ADDR=STRANGER)
    assert status == 403
    assert "relay_" not in body


def test_with_a_token_only_its_bearer_reads_metrics_wherever_it_is(db, settings):
    settings.RELAY_METRICS_TOKEN = TOKEN
    assert scrape(REMOTE_ADDR=STRANGER, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")[0] == 200
    assert scrape(REMOTE_ADDR="127.0.0.1")[0] == 401
    assert scrape(REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer not-the-token")[0] == 403
    assert scrape(REMOTE_ADDR=STRANGER, HTTP_AUTHORIZATION=f"Basic {TOKEN}")[0] == 401


def test_the_probes_stay_open_and_name_no_tenant(acme, globex):
    for path in ("/healthz", "/readyz"):
        response = Client().get(path, REMOTE_ADDR=STRANGER)
        assert response.status_code == 200
        body = response.content.decode()
        assert '"status": "ok"' in body
        for tenant in (acme, globex):
            assert tenant.environment.name not in body
            assert str(tenant.environment.id) not in body


def _outward_address() -> str | None:
    """This host's own non-loopback address, if it has one (no packet is sent)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.mark.live
def test_a_live_instance_serves_metrics_to_loopback_and_refuses_the_network(live_instances):
    address = _outward_address()
    if address is None:
        pytest.skip("this host has no non-loopback address to call from")
    # A second endpoint on every interface, so a client can come from the network side.
    public = free_port()
    args = ("-e", f"tcp:port={public}:interface=0.0.0.0")
    (gw,) = live_instances(1, args=args, ALLOWED_HOSTS=f"127.0.0.1,{address}", **timings())
    assert status_of(f"{gw.http_url}/metrics") == 200
    assert status_of(f"http://{address}:{public}/metrics") == 403
    assert status_of(f"http://{address}:{public}/healthz") == 200


@pytest.mark.live
def test_a_live_instance_with_a_token_wants_it_even_from_loopback(live_instances):
    (gw,) = live_instances(1, RELAY_METRICS_TOKEN=TOKEN, **timings())
    assert status_of(f"{gw.http_url}/metrics", TOKEN) == 200
    assert status_of(f"{gw.http_url}/metrics") == 401
    assert status_of(f"{gw.http_url}/metrics", "guess") == 403
    assert http("GET", f"{gw.http_url}/readyz")[0] == 200
