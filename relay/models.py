"""Tenancy: environments (tenants), their API keys, users, channels and memberships.

Everything below an Environment is reached through it: lookups always filter by the
caller's environment, so an object in another tenant is simply not found (404).
"""

import hashlib
import secrets
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

API_KEY_PREFIX = "rk_"


def new_signing_secret() -> str:
    """Return a fresh per-environment token signing secret (256 bits)."""
    return secrets.token_urlsafe(32)


def hash_api_key(secret: str) -> str:
    """Return the stored digest of an API key.

    SHA-256 rather than a slow password hash: keys are 256-bit random, so there is
    nothing to brute-force, and every API call must verify one.
    """
    return hashlib.sha256(secret.encode()).hexdigest()


class Environment(models.Model):
    """A tenant. Nothing is ever shared or visible across environments."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=128, unique=True)
    # Signs this tenant's connection tokens; the tenant's backend may hold it to mint
    # tokens itself. Rotating it invalidates every token signed with the old one.
    signing_secret = models.CharField(max_length=128, default=new_signing_secret)
    secret_rotated_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(auto_now_add=True)
    # Staff who are not superusers see, in admin, only the environments they are granted here.
    staff = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="relay_environments",
        help_text="Staff (other than superusers) who may see this environment in admin.",
    )
    # Presence settings (docs/contract.md, "Rich presence" and "Large rooms and signals"),
    # read and changed by the tenant through GET/PATCH /v1/settings.
    allow_invisible = models.BooleanField(
        default=True, help_text="Users may turn invisible (look offline while connected)."
    )
    share_last_seen = models.BooleanField(
        default=True, help_text="presence.query tells members when a user was last seen."
    )
    large_room_members = models.PositiveIntegerField(
        default=1000,
        help_text="A channel with more members than this gets occupancy counts instead of per-user presence.",
    )
    signal_max_members = models.PositiveIntegerField(
        default=100, help_text="Signals (typing indicators) are refused in channels with more members than this."
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiKeyQuerySet(models.QuerySet):
    def active(self) -> "ApiKeyQuerySet":
        return self.filter(revoked_at__isnull=True)


class ApiKey(models.Model):
    """A management API key: stored as a digest, shown once, told apart by its prefix."""

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="api_keys")
    label = models.CharField(max_length=128, blank=True)
    # The first characters of the key, kept in clear so staff can tell keys apart.
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.environment})"

    @classmethod
    def issue(cls, environment: Environment, label: str = "") -> tuple["ApiKey", str]:
        """Create a key and return it with its secret, which is not stored and never shown again."""
        secret = API_KEY_PREFIX + secrets.token_urlsafe(32)
        key = cls.objects.create(
            environment=environment,
            label=label,
            prefix=secret[: len(API_KEY_PREFIX) + 8],
            digest=hash_api_key(secret),
        )
        return key, secret


class User(models.Model):
    """A person or worker inside one environment; `external_id` is the API's `id`."""

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="users")
    external_id = models.CharField("id", max_length=128)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Bumped in the transaction of every change to the user's memberships (relay/membership.py):
    # it orders the changes, and nothing that happens after the commit can lose it.
    membership_version = models.BigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["environment", "external_id"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "external_id"], name="user_id_unique_per_environment")
        ]

    def __str__(self) -> str:
        return self.external_id


class Channel(models.Model):
    """A conversation. Presence and messages reach its members only, whatever its type."""

    class Type(models.TextChoices):
        PUBLIC = "public"
        PRIVATE = "private"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="channels")
    name = models.CharField(max_length=128)
    type = models.CharField(max_length=16, choices=Type.choices, default=Type.PUBLIC)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(User, through="Membership", related_name="channels")
    # The seq of the channel's newest chat message: bumped in the same transaction that
    # inserts the message (chat.actions.send_message), so it is never ahead of what is
    # committed.
    last_seq = models.PositiveBigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["environment", "name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's membership of a channel in the same environment."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["channel", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.channel}"

    def clean(self) -> None:
        # The API can only pair a tenant's own user and channel; admin forms could pair any two,
        # and a user in another tenant's channel would hear its presence and messages.
        if self.user_id and self.channel_id and self.user.environment_id != self.channel.environment_id:
            raise ValidationError("The user and the channel belong to different environments.")
