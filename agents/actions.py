"""Writes to the agent registry (docs/contract.md, 5. Agents): register, heartbeat, deregister and the sweep.

Every write is bound to the identity of the caller: a row belongs to the user whose
connection first registered it, and no other identity can change, refresh or remove it.
"""

import logging
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.exceptions import InstanceOwned, RegistrationsCapped
from agents.models import Registration
from relay import metrics
from relay.frames import Capability
from relay.logging import Event, log_event
from relay.models import User

logger = logging.getLogger(__name__)

# The registry's one source of "now", injectable: tests replace it to age rows
# past the TTL without sleeping.
clock: Callable[[], datetime] = timezone.now

# Rows deleted per sweep transaction, so one large sweep never holds SQLite's single
# write lock long enough to stall the registers and heartbeats queued behind it.
SWEEP_BATCH = 500

# Why the registrations being deleted now go: "swept" inside the sweep, "deregistered" otherwise
# (a worker's deregister, an admin's delete). Read by whoever reports the deletion (webhooks).
removal_reason: ContextVar[str] = ContextVar("removal_reason", default="deregistered")


def do_register(
    user: User, instance: str, capability: Capability, connection_id: str, now: datetime | None = None
) -> tuple[Registration, bool]:
    """Create or refresh `user`'s registration of `instance`; return it and whether it was created.

    Raises InstanceOwned, leaving the row untouched, when another identity owns the instance.
    """
    now = now or clock()
    fields = {
        "connection_id": connection_id,
        "cognition": capability.cognition,
        "weight": capability.weight,
        "family": capability.family,
        "host": capability.host,
        "last_seen": now,
    }
    try:
        with transaction.atomic():
            # Two identities racing for one instance: on SQLite the IMMEDIATE transaction
            # serialises them; on PostgreSQL the loser's INSERT hits the unique constraint,
            # get_or_create rolls back to its savepoint and re-reads the winner's row (locked,
            # so a concurrent re-register of the winner cannot interleave). Either way the
            # loser sees the winner's identity below and is refused.
            row, created = Registration.objects.select_for_update().get_or_create(
                environment_id=user.environment_id,
                instance=instance,
                defaults={"identity": user, "registered_at": now, **fields},
            )
            if created:
                _hold_to_the_cap(user)
            else:
                if row.identity_id != user.pk:
                    raise InstanceOwned(instance)
                # A re-registration (a reconnect, on any Relay instance) keeps registered_at
                # and replaces everything else, omitted capability fields included.
                for name, value in fields.items():
                    setattr(row, name, value)
                row.save(update_fields=list(fields))
    except (InstanceOwned, RegistrationsCapped) as refused:
        metrics.AGENT_REGISTRATIONS.labels(outcome="rejected").inc()
        log_event(
            logger,
            Event.AGENT_REJECTED,
            instance=instance,
            reason="instance_owned" if isinstance(refused, InstanceOwned) else "limit_reached",
            environment=str(user.environment_id),
        )
        raise
    metrics.AGENT_REGISTRATIONS.labels(outcome="created" if created else "refreshed").inc()
    log_event(logger, Event.AGENT_REGISTERED, instance=instance, environment=str(user.environment_id))
    return row, created


def _hold_to_the_cap(user: User) -> None:
    """Raise RegistrationsCapped (rolling back the new row) when `user` now holds more than the cap."""
    # The identity's row locked first: two new registrations of one identity are counted one
    # after the other (each sees the other's row once it committed), so neither slips past.
    list(User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True))
    if Registration.objects.filter(identity=user).count() > settings.RELAY_MAX_AGENTS_PER_USER:
        raise RegistrationsCapped(settings.RELAY_MAX_AGENTS_PER_USER)


def do_heartbeat(user: User, instance: str, now: datetime | None = None) -> bool:
    """Refresh `last_seen` of `user`'s own registration of `instance`; False when there is none."""
    # Filtering on the identity makes a foreign or unknown instance the same silent no-op,
    # so a heartbeat cannot be used to probe another identity's instances.
    updated = Registration.objects.filter(environment_id=user.environment_id, instance=instance, identity=user).update(
        last_seen=now or clock()
    )
    return updated > 0


def do_deregister(user: User, instance: str) -> bool:
    """Remove `user`'s own registration of `instance`; False when there is none."""
    deleted, _ = Registration.objects.filter(
        environment_id=user.environment_id, instance=instance, identity=user
    ).delete()
    if deleted:
        log_event(logger, Event.AGENT_DEREGISTERED, instance=instance, environment=str(user.environment_id))
    return deleted > 0


def sweep_stale(now: datetime | None = None, ttl_ms: int | None = None) -> list[tuple[str, str]]:
    """Remove every registration unseen for longer than the TTL; return their (environment, instance).

    Safe when several Relay instances sweep at once: each removed row is deleted, and
    logged as `agent.swept`, by exactly one of them.
    """
    ttl_ms = settings.RELAY_AGENT_TTL_MS if ttl_ms is None else ttl_ms
    cutoff = (now or clock()) - timedelta(milliseconds=ttl_ms)
    stale = Registration.objects.filter(last_seen__lt=cutoff)
    swept: list[tuple[str, str]] = []
    # An unlocked look first: most sweeps find nothing, and a write transaction on SQLite
    # takes the database-wide write lock even when it writes nothing.
    while stale.exists():
        with transaction.atomic():
            # PostgreSQL: skip rows another sweeper has locked, they are its to delete and log.
            # SQLite: the IMMEDIATE transaction holds the write lock, which serialises sweepers
            # and heartbeats the same way. Locked rows cannot be refreshed before the DELETE.
            locked = stale.select_for_update(skip_locked=True).order_by("pk")
            batch = list(locked.values_list("pk", "environment_id", "instance")[:SWEEP_BATCH])
            # The DELETE re-checks staleness itself, so even without row locks (a backend that
            # ignores FOR UPDATE) a row a heartbeat just refreshed is never removed.
            token = removal_reason.set("swept")
            try:
                Registration.objects.filter(pk__in=[pk for pk, _, _ in batch], last_seen__lt=cutoff).delete()
            finally:
                removal_reason.reset(token)
        for _, environment_id, instance in batch:
            swept.append((str(environment_id), instance))
            log_event(logger, Event.AGENT_SWEPT, instance=instance, environment=str(environment_id))
        metrics.AGENT_SWEPT.inc(len(batch))
        if len(batch) < SWEEP_BATCH:
            break
    return swept
