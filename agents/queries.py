"""Reads of the agent registry: listings for the API and liveness for the admin."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import QuerySet

from agents import actions
from agents.models import Registration
from relay.models import Environment


def alive_since(now: datetime | None = None) -> datetime:
    """Return the oldest `last_seen` that still counts as alive (within RELAY_AGENT_TTL_MS)."""
    return (now or actions.clock()) - timedelta(milliseconds=settings.RELAY_AGENT_TTL_MS)


def registrations_of(environment: Environment, **capability: str) -> QuerySet[Registration]:
    """Return the environment's registrations, oldest first, matching the given capability fields."""
    return (
        Registration.objects.filter(environment=environment, **capability)
        .select_related("identity")
        .order_by("registered_at", "instance")
    )


def registration_json(row: Registration) -> dict:
    """Return a registration as the API shows it (CONTRACT.md section 2)."""
    return {
        "instance": row.instance,
        "identity": row.identity.external_id,
        "capability": row.capability(),
        "registered_at": row.registered_at.isoformat(),
        "last_seen": row.last_seen.isoformat(),
    }
