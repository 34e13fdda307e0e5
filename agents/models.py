"""The durable agent registry (docs/contract.md, 5. Agents): one row per registered worker instance of a tenant."""

from django.db import models

from relay.models import Environment, User


class Registration(models.Model):
    """A worker instance registered by an identity; kept alive by heartbeats, aged out by the sweep.

    Instance ids are chosen by each tenant's workers, so they are unique per environment
    only: two tenants may both run `w-1`. The capability columns are enrolment attributes
    for people and dashboards; nothing routes on them.
    """

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="agent_registrations")
    instance = models.CharField(max_length=128)
    # The authenticated user of the connection that first registered the instance: the
    # only identity that may re-register, heartbeat or deregister it.
    identity = models.ForeignKey(User, on_delete=models.CASCADE, related_name="agent_registrations")
    # The connection of the latest registration; kept for lookups, never for liveness.
    connection_id = models.CharField(max_length=64)
    # NULL is "not given" in every capability column alike (weight has no empty value),
    # so the API and admin tell an omitted field apart the same way for all four.
    cognition = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    weight = models.FloatField(null=True, blank=True)
    family = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    host = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    registered_at = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        ordering = ["environment", "instance"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "instance"], name="agent_instance_unique_per_environment")
        ]
        indexes = [
            # The sweep's `last_seen < cutoff` scan, on every instance every RELAY_AGENT_SWEEP_MS.
            models.Index(fields=["last_seen"], name="agent_last_seen_idx"),
            models.Index(fields=["connection_id"], name="agent_connection_idx"),
        ]

    def __str__(self) -> str:
        return self.instance

    def capability(self) -> dict:
        """Return the capability fields that were given, and only those."""
        given = {"cognition": self.cognition, "weight": self.weight, "family": self.family, "host": self.host}
        return {key: value for key, value in given.items() if value is not None}
