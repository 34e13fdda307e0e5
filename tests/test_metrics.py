"""/metrics: Relay's Prometheus families are scraped, and each moves when its event happens."""

import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents.actions import sweep_stale
from agents.models import Registration
from devtools.embedded_redis import free_port
from presence.fabric import group_name
from tests.chat_helpers import send_payload
from tests.support import Socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_presence_service")]


def scrape() -> dict[tuple[str, tuple], float]:
    """Every sample /metrics exposes, by (name, sorted labels)."""
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def scrape_value(name: str, **labels: str) -> float:
    return scrape().get((name, tuple(sorted(labels.items()))), 0.0)


class Scrapes:
    """A before/after pair of scrapes: `moved(name, **labels)` is the sample's increase."""

    def __init__(self) -> None:
        self.before = scrape()
        self.after: dict = {}

    def again(self) -> None:
        self.after = scrape()

    def moved(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return self.after.get(key, 0.0) - self.before.get(key, 0.0)


async def test_connections_frames_presence_and_messages_move_their_families(acme, closing):
    scrapes = Scrapes()
    linh = await closing(Socket.open(acme.token("linh")))
    await linh.next_of("presence.changed")  # her own online, published once
    second = await closing(Socket.open(acme.token("linh")))  # already online: suppressed
    tuan = await closing(Socket.open(acme.token("tuan")))
    # tuan shares two channels with linh: two copies of his online reach her, one is dropped.
    await linh.wait_for(lambda s: {"user": "tuan", "state": "online"} in s.of_type("presence.changed"))
    ack = await linh.send_and_ack(send_payload(acme.channels["fleet"], "metrics"))
    assert ack["type"] == "message.ack"
    await tuan.next_of("message.created")
    scrapes.again()
    assert scrapes.moved("relay_connections_open") == 3
    assert scrapes.moved("relay_connects_total") == 3
    assert scrapes.moved("relay_frames_in_total", type="message.send") == 1
    assert scrapes.moved("relay_frames_out_total", type="message.ack") == 1
    assert scrapes.moved("relay_frames_out_total", type="connection.ack") == 3
    assert scrapes.moved("relay_presence_published_total", state="online") == 2
    assert scrapes.moved("relay_presence_suppressed_total", state="online", reason="already online") == 1
    assert scrapes.moved("relay_presence_dedup_drops_total") >= 1
    assert scrapes.moved("relay_message_send_seconds_count") == 1
    assert scrapes.moved("relay_redis_op_seconds_count", op="admit") == 3
    # A bad frame counts under "unknown", never under a type the client made up.
    await linh.send("made.up", {})
    await linh.next_of("error")
    for socket in (linh, second, tuan):
        await socket.close()
    scrapes.again()
    assert scrapes.moved("relay_closes_total") == 3
    assert scrapes.moved("relay_connections_open") == 0
    assert scrapes.moved("relay_frames_in_total", type="unknown") == 1
    assert scrapes.moved("relay_frames_in_total", type="made.up") == 0


async def test_refusals_and_invalid_fabric_payloads_are_counted(acme, closing):
    scrapes = Scrapes()
    linh = await closing(Socket.open(acme.token("linh")))
    await linh.next_of("presence.snapshot")
    fleet = str(acme.channels["fleet"].id)
    await get_channel_layer().group_send(group_name(fleet), {"type": "presence.transition", "user": "x"})
    refused = await closing(Socket.open("forged"))
    assert await refused.closed() == 4401
    await linh.wait_for(lambda s: scrape_value("relay_presence_invalid_payloads_total") > 0, timeout=5)
    scrapes.again()
    assert scrapes.moved("relay_connections_refused_total", code="4401") == 1
    assert scrapes.moved("relay_presence_invalid_payloads_total") == 1


async def test_presence_failures_are_counted_by_op(acme, settings, closing):
    settings.RELAY_PRESENCE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    scrapes = Scrapes()
    linh = await closing(Socket.open(acme.token("linh")))
    await linh.next_of("presence.snapshot")
    await linh.close()
    scrapes.again()
    assert scrapes.moved("relay_presence_failures_total", op="admit") == 1
    assert scrapes.moved("relay_presence_published_total", state="online") == 0


async def test_agent_registrations_and_sweeps_are_counted(acme, closing):
    scrapes = Scrapes()
    worker = await closing(Socket.open(acme.token("linh")))
    await worker.send("register", {"instance": "w-1", "capability": {"family": "gpu"}})
    await worker.next_of("register.ack")
    other = await closing(Socket.open(acme.token("tuan")))
    await other.send("register", {"instance": "w-1"})
    assert (await other.next_of("error"))["code"] == "instance_owned"
    await database_sync_to_async(Registration.objects.create)(
        environment=acme.environment,
        instance=f"old-{uuid.uuid4().hex[:6]}",
        identity=acme.users["hermit"],
        connection_id="gone",
        registered_at=timezone.now() - timedelta(hours=1),
        last_seen=timezone.now() - timedelta(hours=1),
    )
    swept = await database_sync_to_async(sweep_stale)()
    scrapes.again()
    assert scrapes.moved("relay_agent_registrations_total", outcome="created") == 1
    assert scrapes.moved("relay_agent_registrations_total", outcome="rejected") == 1
    assert scrapes.moved("relay_agent_swept_total") == len(swept) == 1
