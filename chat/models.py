"""A chat message: one per `message.send`, numbered per channel."""

import uuid

from django.db import models
from django.utils import timezone

from relay.models import Channel, User


class Message(models.Model):
    """A chat message: `seq` numbers a channel's messages 1, 2, 3… with no gap."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="messages")
    author = models.ForeignKey(User, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveBigIntegerField()
    # The client's key for this send: a resend with the same key answers the same ack.
    idem_key = models.CharField(max_length=128)
    text = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["channel", "seq"]
        constraints = [
            # Also the (channel, seq) index that history and resume read through.
            models.UniqueConstraint(fields=["channel", "seq"], name="message_seq_unique_per_channel"),
            models.UniqueConstraint(fields=["channel", "author", "idem_key"], name="message_idem_key_unique"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} in {self.channel_id}"
