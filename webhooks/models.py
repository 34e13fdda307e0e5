"""Webhook endpoints per environment, and the deliveries owed to them (the outbox).

A Delivery row is one event for one endpoint. Events decided in the database (members,
messages, agents) are written as rows in the transaction of the change; events decided in
Redis (presence) reach the rows through the bucket streams (webhooks/stream.py). Every running
instance delivers due rows (webhooks/delivery.py).
"""

import base64
import secrets
import uuid

from django.db import models
from django.utils import timezone

from relay.models import Environment

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


class Endpoint(models.Model):
    """A URL of the tenant's backend that receives the events it subscribed to (`["*"]`: all)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2048)
    events = models.JSONField(default=list)
    # Kept as given, since every delivery is signed with it; shown once, in the POST's answer.
    secret = models.CharField(max_length=128, default=new_secret)
    enabled = models.BooleanField(default=True)
    # When a receiver answered 410 Gone: nothing more is sent to it.
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["environment", "created_at", "id"]
        indexes = [models.Index(fields=["environment", "enabled"], name="webhook_endpoint_env_idx")]

    def __str__(self) -> str:
        return self.url

    def wants(self, event_type: str) -> bool:
        """Whether this endpoint subscribed to `event_type`."""
        return "*" in self.events or event_type in self.events


class Delivery(models.Model):
    """One event owed to one endpoint, with its attempts so far."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    DISABLED = "disabled"
    STATUSES = [(s, s) for s in (PENDING, DELIVERED, FAILED, DISABLED)]

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    # The `webhook-id` header: one per event, the same on every retry and for every endpoint.
    webhook_id = models.CharField(max_length=100)
    event_type = models.CharField(max_length=64)
    # The signed body, byte for byte as sent on every attempt.
    body = models.TextField()
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # The instance that leased the row for its attempt in flight (empty: none).
    lease = models.CharField(max_length=64, blank=True, default="")
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    # What went wrong, short and without the body: "timeout", "connection refused", "HTTP 500".
    last_error = models.CharField(max_length=200, blank=True, default="")
    last_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            # The same event written twice (a stream entry consumed again after a crash) is one row.
            models.UniqueConstraint(fields=["endpoint", "webhook_id"], name="webhook_delivery_once_per_endpoint")
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="webhook_delivery_due_idx")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.webhook_id}"
