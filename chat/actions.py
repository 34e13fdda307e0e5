"""Storing a `message.send` with its channel's next seq, exactly once per idem_key.

Synchronous: the socket side (`chat.handlers`) calls it through `database_sync_to_async`.
"""

import uuid
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import Exists, F

from chat.exceptions import NotAMember
from chat.models import Message
from chat.queries import message_json
from relay.frames import MessageAck
from relay.models import Channel, Membership, User


@dataclass(frozen=True)
class SendResult:
    """What a `message.send` produced: its ack, the stored message's payload, and whether it is new."""

    ack: MessageAck
    message: dict
    created: bool


def _result(message: Message, *, created: bool) -> SendResult:
    ack = MessageAck(idem_key=message.idem_key, id=str(message.id), channel=str(message.channel_id), seq=message.seq)
    return SendResult(ack=ack, message=message_json(message), created=created)


def send_message(user: User, channel_id: str, idem_key: str, text: str) -> SendResult:
    """Store a message with the channel's next seq, or return the one this idem_key already stored."""
    try:
        return _result(_insert(user, channel_id, idem_key, text), created=True)
    except IntegrityError:
        # The idem_key was stored before: a send again after a lost ack, or two sends of it at
        # once. The insert's whole transaction rolled back, its seq bump included, so no seq was
        # skipped. Looking first would cost every send a query for what few sends are.
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
    # The bump is also the membership check: it updates no row of a channel the user is not a
    # member of, nor of one in another environment.
    pk = uuid.UUID(channel_id)
    member = Membership.objects.filter(channel_id=pk, user=user)
    mine = Channel.objects.filter(Exists(member), pk=pk, environment_id=user.environment_id)
    with transaction.atomic():
        if not mine.update(last_seq=F("last_seq") + 1):
            raise NotAMember(channel_id)
        seq = Channel.objects.values_list("last_seq", flat=True).get(pk=pk)
        return Message.objects.create(channel_id=pk, author=user, seq=seq, idem_key=idem_key, text=text)
