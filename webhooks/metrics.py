"""Webhook metrics on /metrics: attempts by outcome, the backlog and its oldest event's age."""

from collections.abc import Iterator

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

DELIVERIES = Counter(
    "relay_webhook_deliveries_total",
    "Webhook attempts made by this instance, by outcome (delivered, retry, failed: given up, disabled: 410)",
    ["outcome"],
)
ATTEMPT_SECONDS = Histogram(
    "relay_webhook_attempt_seconds",
    "How long one webhook POST took, answered or not",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STREAM_EVENTS = Counter("relay_webhook_stream_events_total", "Presence events this instance moved into the outbox")
STREAM_SECONDS = Histogram(
    "relay_webhook_stream_batch_seconds", "How long one batch of presence events took to reach the outbox"
)
ENVIRONMENTS = Gauge(
    "relay_webhook_environments", "Environments with an enabled endpoint, as this instance last read them"
)


class BacklogCollector(Collector):
    """The deliveries still owed (all instances) and how old the oldest is, read at each scrape."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from webhooks.models import Delivery

        backlog = GaugeMetricFamily("relay_webhook_backlog", "Webhook deliveries pending, on every instance")
        oldest = GaugeMetricFamily(
            "relay_webhook_oldest_pending_seconds", "Age of the oldest pending webhook delivery (0: none)"
        )
        try:
            found = Delivery.objects.filter(status=Delivery.PENDING).aggregate(
                count=Count("id"), oldest=Min("created_at")
            )
        except Exception:
            return
        backlog.add_metric([], found["count"])
        age = (timezone.now() - found["oldest"]).total_seconds() if found["oldest"] else 0.0
        oldest.add_metric([], max(age, 0.0))
        yield backlog
        yield oldest

    def describe(self) -> list:
        # Describing without collecting: registration must not query the database.
        return []


REGISTRY.register(BacklogCollector())
