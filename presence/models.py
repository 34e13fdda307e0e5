"""The one durable piece of presence: each user's chosen status and when they were last seen.

Online and offline stay ephemeral (Redis only); what a user chose (a status, a text, an expiry,
invisibility) must outlive their connections, an instance restart and a Redis restarted empty,
so it lives here and Redis holds a copy for the hot path (presence/status.py).
"""

from django.db import models

from relay.models import User

STATUS_CHOICES = [("available", "available"), ("away", "away"), ("busy", "busy"), ("dnd", "do not disturb")]
MAX_STATUS_TEXT = 140
MAX_STATUS_EMOJI = 32


class UserStatus(models.Model):
    """A user's status (docs/contract.md, Rich presence): one row per user, made on first use."""

    user = models.OneToOneField(User, on_delete=models.CASCADE, related_name="presence_status", primary_key=True)
    status = models.CharField(max_length=16, choices=STATUS_CHOICES, default="available")
    text = models.CharField(max_length=MAX_STATUS_TEXT, blank=True, default="")
    emoji = models.CharField(max_length=MAX_STATUS_EMOJI, blank=True, default="")
    # Indexed: every instance looks for passed expiries once per refresh interval.
    until = models.DateTimeField(
        null=True, blank=True, db_index=True, help_text="When the status returns to available."
    )
    invisible = models.BooleanField(default=False, help_text="Looks offline to everyone else while connected.")
    last_seen_at = models.DateTimeField(
        null=True, blank=True, help_text="When the last connection closed, or the user turned invisible."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "user status"
        verbose_name_plural = "user statuses"

    def __str__(self) -> str:
        return f"{self.user_id}: {self.status}"
