"""Reading chat messages: a channel's history by seq, its newest seq, who may read it.

Synchronous: the socket side (`chat.handlers`) calls these through `database_sync_to_async`,
the HTTP history (`chat.views`) directly.
"""

import uuid

from chat.models import Message
from relay.frames import MessageCreated
from relay.models import Channel, Membership, User

# One query's worth of history: a resume or an HTTP page never loads more rows at once.
PAGE_SIZE = 500


def message_json(message: Message) -> MessageCreated:
    """The `message.created` payload of a stored message (also the HTTP history item)."""
    return MessageCreated(
        id=str(message.id),
        channel=str(message.channel_id),
        seq=message.seq,
        user=message.author.external_id,
        text=message.text,
        created_at=message.created_at.isoformat(),
    )


def is_member(user: User, channel_id: str) -> bool:
    """Whether `user` belongs to the channel, which must be in the user's own environment."""
    return Membership.objects.filter(
        user=user, channel_id=uuid.UUID(channel_id), channel__environment_id=user.environment_id
    ).exists()


def last_seq(channel_id: str) -> int:
    """The seq of the channel's newest committed message (0 when it has none)."""
    return Channel.objects.values_list("last_seq", flat=True).get(pk=uuid.UUID(channel_id))


def messages_after(
    channel_id: str, after: int, limit: int = PAGE_SIZE, until: int | None = None
) -> list[MessageCreated]:
    """Up to `limit` messages of the channel with `after < seq (<= until)`, in seq order, as payloads."""
    found = Message.objects.select_related("author").filter(channel_id=uuid.UUID(channel_id), seq__gt=after)
    if until is not None:
        found = found.filter(seq__lte=until)
    return [message_json(message) for message in found.order_by("seq")[:limit]]
