"""The transactional outbox: an event decided in the database is written in the same transaction.

Each receiver below runs inside the transaction of the change it reports (an API call's
`atomic`, a deletion's collector, the agent registry's writes, a status set or admin edit), so
the Delivery rows commit or roll back with the change: a committed member, message, agent or
status change always has its deliveries, and a rolled-back one never does. A status expiry is
an UPDATE, not a save: its claim (presence/status.py) calls `record_status` in its transaction.
bulk_create() sends no signals and so no events (it builds worlds nobody is connected to:
setupdemo, the benchmark).
"""

import functools

from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver
from django.utils import timezone

from agents import actions as agent_actions
from agents.models import Registration
from chat.models import Message
from chat.queries import message_json
from presence.models import UserStatus
from relay.frames import format_instant
from relay.models import Membership, User
from webhooks import events, worker
from webhooks.models import Delivery, Endpoint


def record(environment_id: str, event_type: str, data: dict, webhook_id: str | None = None) -> int:
    """Write one event for every enabled endpoint of the environment that wants it; return how many.

    Call it inside the transaction of the change. The in-process signal is sent after the commit.
    """
    webhook_id = webhook_id or events.new_webhook_id()
    body = events.envelope(event_type, events.iso(timezone.now()), data)
    rows = [
        Delivery(endpoint=endpoint, webhook_id=webhook_id, event_type=event_type, body=body)
        for endpoint in Endpoint.objects.filter(environment_id=environment_id, enabled=True)
        if endpoint.wants(event_type)
    ]
    if rows:
        Delivery.objects.bulk_create(rows, ignore_conflicts=True)
        transaction.on_commit(worker.wake)
    transaction.on_commit(functools.partial(events.send_signal, str(environment_id), event_type, data, webhook_id))
    return len(rows)


def _member_data(channel_id: object, user_pk: int) -> dict | None:
    external_id = User.objects.filter(pk=user_pk).values_list("external_id", flat=True).first()
    return None if external_id is None else {"channel": str(channel_id), "user": external_id}


@receiver(post_save, sender=Membership)
def _membership_saved(sender: type, instance: Membership, created: bool, **kwargs: object) -> None:
    # relay.membership's pre_save remembered the pair a changed row had before.
    old = getattr(instance, "_old_pair", None)
    if not created and old == (instance.user_id, instance.channel_id):
        return
    environment_id = instance.channel.environment_id
    if old is not None and not created and (data := _member_data(old[1], old[0])) is not None:
        record(environment_id, events.MEMBER_REMOVED, data)
    if (data := _member_data(instance.channel_id, instance.user_id)) is not None:
        record(environment_id, events.MEMBER_ADDED, data)


@receiver(post_delete, sender=Membership)
def _membership_deleted(sender: type, instance: Membership, **kwargs: object) -> None:
    # A user or channel deleted with its memberships: their rows still stand inside the collector.
    environment_id = instance.channel.environment_id
    if (data := _member_data(instance.channel_id, instance.user_id)) is not None:
        record(environment_id, events.MEMBER_REMOVED, data)


@receiver(post_save, sender=Message)
def _message_saved(sender: type, instance: Message, created: bool, **kwargs: object) -> None:
    if created:
        record(instance.author.environment_id, events.MESSAGE_CREATED, dict(message_json(instance)))


@receiver(post_save, sender=Registration)
def _agent_saved(sender: type, instance: Registration, created: bool, **kwargs: object) -> None:
    if created:
        data = {"instance": instance.instance, "identity": instance.identity.external_id}
        data["capability"] = instance.capability()
        record(instance.environment_id, events.AGENT_REGISTERED, data)


@receiver(post_delete, sender=Registration)
def _agent_deleted(sender: type, instance: Registration, **kwargs: object) -> None:
    reason = agent_actions.removal_reason.get()
    record(instance.environment_id, events.AGENT_REMOVED, {"instance": instance.instance, "reason": reason})


# What a `user.status` event carries of the row besides the user: a save that changes none of
# them (an unchanged set, `last_seen_at`) sends nothing.
STATUS_FIELDS = ("status", "text", "emoji", "until", "invisible")
DEFAULT_STATUS = tuple(UserStatus._meta.get_field(name).get_default() for name in STATUS_FIELDS)


def record_status(row: UserStatus) -> None:
    """Write the `user.status` event of a status row as it now stands; call inside its transaction."""
    data = {"user": row.user.external_id, "status": row.status, "text": row.text, "emoji": row.emoji}
    data.update(until=format_instant(row.until), invisible=row.invisible)
    record(row.user.environment_id, events.USER_STATUS, data)


@receiver(pre_save, sender=UserStatus)
def _remember_the_old_status(sender: type, instance: UserStatus, **kwargs: object) -> None:
    rows = UserStatus.objects.filter(pk=instance.pk)
    if transaction.get_connection().in_atomic_block:
        # Locked until the commit: of two edits of one row, the second compares with the first's.
        rows = rows.select_for_update()
    instance._old_status = rows.values_list(*STATUS_FIELDS).first()


@receiver(post_save, sender=UserStatus)
def _status_saved(sender: type, instance: UserStatus, **kwargs: object) -> None:
    # Every save, whoever made it (presence.set, PUT, admin): one event when the status changed.
    old = getattr(instance, "_old_status", None) or DEFAULT_STATUS
    if old != tuple(getattr(instance, name) for name in STATUS_FIELDS):
        record_status(instance)
