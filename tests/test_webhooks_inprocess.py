"""Webhooks inside one process: the in-process signal of presence transitions, and /metrics."""

import pytest
from django.test import Client

from tests.support import Socket, until
from webhooks import events
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
