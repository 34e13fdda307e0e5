"""Channel membership, and telling a user's live connections when it changes.

Every connection joins its user's own group, so a membership change made through
the API on any instance reaches that user's connections on every instance at once.
"""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, transaction

from relay.logging import log_event
from relay.models import Channel, Membership, User

logger = logging.getLogger(__name__)


def user_group(user_pk: int) -> str:
    """The channel-layer group of one user's connections (pk: unique across tenants)."""
    return f"user.{user_pk}"


def channel_ids_of(user: User) -> set[str]:
    """Return the ids of the channels `user` belongs to."""
    return {str(pk) for pk in Membership.objects.filter(user=user).values_list("channel_id", flat=True)}


def add_member(channel: Channel, user: User) -> bool:
    """Make `user` a member of `channel`; return False when they already were."""
    try:
        with transaction.atomic():
            Membership.objects.create(channel=channel, user=user)
    except IntegrityError:
        return False
    _notify(user, channel, member=True)
    return True


def remove_member(channel: Channel, user: User) -> bool:
    """End `user`'s membership of `channel`; return False when there was none."""
    deleted, _ = Membership.objects.filter(channel=channel, user=user).delete()
    if deleted:
        _notify(user, channel, member=False)
    return bool(deleted)


def _notify(user: User, channel: Channel, *, member: bool) -> None:
    # Sent after the row changed, so a connection reacting to it never reads the
    # old state. A channel-layer fault leaves the change made (it is durable) and
    # the live connections to pick it up on their next connect.
    try:
        async_to_sync(get_channel_layer().group_send)(
            user_group(user.pk), {"type": "membership.changed", "channel": str(channel.id), "member": member}
        )
    except Exception as error:
        log_event(logger, "membership.notify_failed", logging.ERROR, error=type(error).__name__)
