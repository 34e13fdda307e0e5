"""Reads of the agent registry: listings for the API and liveness for the admin."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import QuerySet
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from agents import actions
from agents.models import Registration
from relay.models import Environment


@with_config(ConfigDict(extra="forbid"))
class CapabilityOut(TypedDict, total=False):
    cognition: str
    weight: float
    family: str
    host: str


@with_config(ConfigDict(extra="forbid"))
class Agent(TypedDict):
    """A registration as the API shows it; `capability` holds only the fields that were given."""

    instance: str
    identity: str
    capability: CapabilityOut
    registered_at: str
    last_seen: str


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


def registration_json(row: Registration) -> Agent:
    """Return a registration as the API shows it (docs/contract.md, 2. HTTP API)."""
    return Agent(
        instance=row.instance,
        identity=row.identity.external_id,
        capability=row.capability(),
        registered_at=row.registered_at.isoformat(),
        last_seen=row.last_seen.isoformat(),
    )
