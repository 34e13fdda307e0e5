"""Webhooks inside one process: the in-process signal of presence transitions, /metrics, and the delivery client."""

import ssl

import aiohttp
import pytest
import trustme
from channels.db import database_sync_to_async
from django.test import Client

from relay.logging import JsonFormatter
from tests.support import Socket, until
from tests.support import events as logged_events
from tests.webhook_helpers import Receiver
from webhooks import addresses, delivery, events, worker
from webhooks.models import Delivery, Endpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_presence_service")]


async def test_a_presence_transition_is_signalled_in_the_process_that_published_it(acme):
    heard = []

    def listen(sender, environment_id, data, **kwargs):
        heard.append((sender, environment_id, data))

    events.event.connect(listen)
    try:
        linh = await Socket.open(acme.token("linh"))
        await until(lambda: heard)
        await linh.close()
    finally:
        events.event.disconnect(listen)
    assert heard == [("user.online", str(acme.environment.id), {"user": "linh"})]


def test_metrics_show_the_backlog_and_its_age(acme):
    endpoint = Endpoint.objects.create(environment=acme.environment, url="http://127.0.0.1:9/h", events=["*"])
    before = Client().get("/metrics").content.decode()
    assert "relay_webhook_backlog 0.0" in before
    Delivery.objects.create(endpoint=endpoint, webhook_id="msg_1", event_type="user.online", body="{}")
    after = Client().get("/metrics").content.decode().splitlines()
    assert "relay_webhook_backlog 1.0" in after
    age = next(line for line in after if line.startswith("relay_webhook_oldest_pending_seconds "))
    assert float(age.split()[1]) >= 0
    assert any(line.startswith("relay_webhook_environments") for line in after)


@database_sync_to_async
def leased_row(acme, url: str) -> tuple[Endpoint, delivery.Claimed]:
    """One `member.added` owed to a new endpoint at `url`, leased as the worker leases it."""
    endpoint = Endpoint.objects.create(environment=acme.environment, url=url, events=["*"])
    body = events.envelope("member.added", "2026-12-05T10:00:00.000+00:00", {"channel": "c", "user": "s3cret-user"})
    Delivery.objects.create(endpoint=endpoint, webhook_id="msg_1", event_type="member.added", body=body)
    (claimed,) = delivery.claim({}, set())
    return endpoint, claimed


async def test_the_delivery_client_connects_only_to_addresses_its_resolver_checked(acme, settings, caplog):
    receiver = Receiver().start()
    # A name (the client looks it up itself) that answers loopback: what a rebinding name
    # answers once the endpoint's check has passed.
    endpoint, claimed = await leased_row(acme, f"http://localhost:{receiver.port}/hooks?key=url-s3cret")
    delivering = worker.Worker()
    try:
        settings.RELAY_WEBHOOK_ALLOW_PRIVATE = False
        refused = await delivery.attempt(delivering.client, claimed)
        await database_sync_to_async(delivery.record)([refused])
        settings.RELAY_WEBHOOK_ALLOW_PRIVATE = True
        allowed = await delivery.attempt(delivering.client, claimed)
    finally:
        await delivering.client.close()
        await delivering.consumer.close()
        receiver.stop()
    assert refused.status_code is None and "loopback" in refused.error
    assert allowed.status_code == 200 and len(receiver.requests) == 1
    (failed,) = logged_events(caplog, "webhook.failed")
    assert str(failed["endpoint"]) == str(endpoint.id) and failed["outcome"] == "retry"
    # The log lines as written (JSON, every field): the reason, never the body, secret or URL.
    written = "\n".join(JsonFormatter().format(record) for record in caplog.records)
    assert "loopback" in written
    for secret_text in (endpoint.secret, "s3cret-user", "url-s3cret"):
        assert secret_text not in written


async def test_tls_is_verified_against_the_urls_name_though_the_resolver_chose_the_address(settings):
    settings.RELAY_WEBHOOK_ALLOW_PRIVATE = True
    authority = trustme.CA()

    def serving(name: str) -> Receiver:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        authority.issue_cert(name).configure_cert(context)
        return Receiver(tls=context).start()

    right, wrong = serving("localhost"), serving("receiver.example")
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    # The delivery client's resolver, with the test's authority trusted.
    connector = aiohttp.TCPConnector(resolver=addresses.PublicResolver(), ssl=trusting)
    try:
        async with aiohttp.ClientSession(connector=connector) as client:
            async with client.post(f"https://localhost:{right.port}/hooks", data=b"{}") as response:
                assert response.status == 200
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await client.post(f"https://localhost:{wrong.port}/hooks", data=b"{}")
    finally:
        right.stop()
        wrong.stop()
    assert (len(right.requests), len(wrong.requests)) == (1, 0)
