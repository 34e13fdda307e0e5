"""Messages in the database: storing a send with its per-channel seq, and reading history.

Synchronous on purpose: the WebSocket side (`relay.chat`) calls these through
`database_sync_to_async`, the HTTP API calls them directly.
"""

import uuid
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F

from relay.exceptions import NotAMember
from relay.models import Channel, Membership, Message, User

# One query's worth of history: a resume or an HTTP page never loads more rows at once.
PAGE_SIZE = 500


def messages_group(channel_id: str) -> str:
    """The channel-layer group of one channel's messages (never the presence group's name)."""
    return f"messages.{channel_id}"


def message_json(message: Message) -> dict:
    """The `message.created` payload of a stored message (also the HTTP history item)."""
    return {
        "id": str(message.id),
        "channel": str(message.channel_id),
        "seq": message.seq,
        "user": message.author.external_id,
        "text": message.text,
        "created_at": message.created_at.isoformat(),
    }


@dataclass(frozen=True)
class SendResult:
    """What a `message.send` produced: its ack, the stored message's payload, and whether it is new."""

    ack: dict
    message: dict
    created: bool


def _result(message: Message, *, created: bool) -> SendResult:
    ack = {"idem_key": message.idem_key, "id": str(message.id), "channel": str(message.channel_id), "seq": message.seq}
    return SendResult(ack=ack, message=message_json(message), created=created)


def is_member(user: User, channel_id: str) -> bool:
    """Whether `user` belongs to the channel, which must be in the user's own environment."""
    return Membership.objects.filter(
        user=user, channel_id=uuid.UUID(channel_id), channel__environment_id=user.environment_id
    ).exists()


def do_send_message(user: User, channel_id: str, idem_key: str, text: str) -> SendResult:
    """Store a message with the channel's next seq, or return the one this idem_key already stored."""
    if not is_member(user, channel_id):
        raise NotAMember(channel_id)
    existing = _sent_before(user, channel_id, idem_key)
    if existing is not None:
        return _result(existing, created=False)
    try:
        return _result(_insert(user, channel_id, idem_key, text), created=True)
    except IntegrityError:
        # Two sends of one idem_key raced past the lookup above. The loser's whole
        # transaction rolled back, its seq bump included, so no seq was skipped.
        existing = _sent_before(user, channel_id, idem_key)
        if existing is None:
            raise
        return _result(existing, created=False)


def _sent_before(user: User, channel_id: str, idem_key: str) -> Message | None:
    return (
        Message.objects.select_related("author")
        .filter(channel_id=uuid.UUID(channel_id), author=user, idem_key=idem_key)
        .first()
    )


def _insert(user: User, channel_id: str, idem_key: str, text: str) -> Message:
    # The seq is allocated by the insert's own transaction, which is what keeps it
    # gapless and strictly increasing under concurrent senders on several instances:
    # - PostgreSQL: the UPDATE takes the channel row's lock until commit, so a second
    #   sender's UPDATE waits, then increments the committed value. Commit order is
    #   seq order, and a rolled-back insert rolls its increment back with it.
    # - SQLite: settings use IMMEDIATE transactions, so the write lock is taken at
    #   BEGIN and writers in every process run one after another (busy timeout).
    # Reading `last_seq` back inside the transaction sees this transaction's own
    # increment on both, and no one else's.
    pk = uuid.UUID(channel_id)
    with transaction.atomic():
        if not Channel.objects.filter(pk=pk).update(last_seq=F("last_seq") + 1):
            raise NotAMember(channel_id)
        seq = Channel.objects.values_list("last_seq", flat=True).get(pk=pk)
        return Message.objects.create(channel_id=pk, author=user, seq=seq, idem_key=idem_key, text=text)


def last_seq(channel_id: str) -> int:
    """The seq of the channel's newest committed message (0 when it has none)."""
    return Channel.objects.values_list("last_seq", flat=True).get(pk=uuid.UUID(channel_id))


def messages_after(channel_id: str, after: int, limit: int = PAGE_SIZE, until: int | None = None) -> list[dict]:
    """Up to `limit` messages of the channel with `after < seq (<= until)`, in seq order, as payloads."""
    found = Message.objects.select_related("author").filter(channel_id=uuid.UUID(channel_id), seq__gt=after)
    if until is not None:
        found = found.filter(seq__lte=until)
    return [message_json(message) for message in found.order_by("seq")[:limit]]
