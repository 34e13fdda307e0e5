"""Channel membership, and telling a user's live connections when it changes.

A change made on any instance (through the API, an admin form, a deletion that cascades) is sent
once, after its commit, to the `membership` group, which each PROCESS joins once (the
`MembershipBus` of its event loop); the bus hands it to the local connections of that user. A
per-user group would cost every connection a SUBSCRIBE and an UNSUBSCRIBE, and would have to be
joined before the user's channels are read, which needs the user, which needs its own database
hop; the bus is joined once, and its short memory of recent changes (`mark` / `listen`) closes
the gap between a connection's read and its registration.

Notices can be lost (pub/sub drops them while a subscriber reconnects; the process that made a
change can die before it tells anyone). Every change also bumps the user's membership version in
its own transaction, which relay/reconcile.py compares each refresh interval, and which orders
reads and notices on each connection (`Applied`).
"""

import functools
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import Signal, receiver

from relay.exceptions import LimitReached
from relay.layer import channel_layer, publish_notice
from relay.logging import Event, log_event
from relay.loops import PerLoop, SharedOnce
from relay.models import Channel, Membership, User

logger = logging.getLogger(__name__)

MEMBERSHIP_GROUP = "membership"
EVENT = "membership.changed"
# Changes remembered for connections still between their read and their registration: a
# connect's database hop takes milliseconds, and a process sees far fewer changes than this
# in that time. A connection that falls further behind re-reads its channels (`listen`).
RECENT_CHANGES = 4096

# Sent (sender=Membership, channel=, user=, membership_id=) once a membership was added and the
# user's live connections were told: an app announces what the new membership makes visible to
# the channel's other members (presence: the added user's `online`). `membership_id` is the new
# row's id, which orders it among the additions; None for an existing row moved to this pair.
member_added = Signal()
# Sent (sender=Membership, channel_id=, user_pk=) once a membership ended and the user's live
# connections were told: an app forgets what it kept of the old membership outside the database
# (presence: the channel among those its reaper would tell of the user's `offline`).
member_removed = Signal()


class MembershipBus:
    """This event loop's one subscriber to membership changes, and its local connections by user.

    A change is handed to the user's local channels as it is read off Redis (`route_group`), in
    order with every other message: a message published after a removal reaches the connection
    after the removal, which then drops it.
    """

    def __init__(self) -> None:
        self.layer = channel_layer()
        self.listeners: dict[int, set[str]] = {}
        self.recent: deque[tuple[int, int, dict]] = deque(maxlen=RECENT_CHANGES)
        self.seq = 0
        # Joined once for this loop; later calls return at once.
        self.start = SharedOnce(lambda: self.layer.route_group(MEMBERSHIP_GROUP, self.received))

    def received(self, message: dict) -> None:
        """One change from the group: remember it and hand it to the user's local connections."""
        try:
            user_pk = int(message["user"])
            message["version"] = int(message["version"])
        except (KeyError, TypeError, ValueError):
            log_event(logger, Event.MEMBERSHIP_INVALID_EVENT, logging.ERROR)
            return
        self.seq += 1
        self.recent.append((self.seq, user_pk, message))
        for channel_name in self.listeners.get(user_pk, ()):
            self._hand(channel_name, message)

    def _hand(self, channel_name: str, message: dict) -> None:
        # A connection that has gone since it registered simply misses it.
        self.layer.send_local(channel_name, message)

    def mark(self) -> int:
        """Where the bus is now: pass it to `listen` after reading the user's channels."""
        return self.seq

    def listen(self, user_pk: int, channel_name: str, since: int) -> bool:
        """Hand `user_pk`'s changes to `channel_name` from now on, and those since `since`.

        Changes that arrived between `since` (taken before the channels were read) and now are
        replayed, first and in order (nothing here awaits, so no change can slip in between):
        each is idempotent against a read that already saw it. False when some of that interval
        is no longer remembered: the caller must read the channels again.
        """
        self.listeners.setdefault(user_pk, set()).add(channel_name)
        for message in self._changes_since(user_pk, since):
            self._hand(channel_name, message)
        return self._remembers_since(since)

    def _remembers_since(self, since: int) -> bool:
        # The remembered changes are numbered without a gap, so the interval is all there when
        # the oldest one remembered is no later than the first one after `since`.
        return not self.recent or self.recent[0][0] <= since + 1

    def _changes_since(self, user_pk: int, since: int) -> list[dict]:
        """`user_pk`'s remembered changes after `since`, in order."""
        return [message for seq, pk, message in self.recent if seq > since and pk == user_pk]

    def forget(self, user_pk: int, channel_name: str) -> None:
        """Stop handing `user_pk`'s changes to `channel_name`."""
        names = self.listeners.get(user_pk)
        if names is not None:
            names.discard(channel_name)
            if not names:
                del self.listeners[user_pk]


# The membership bus of the running event loop.
bus = PerLoop(MembershipBus)


def add_member(channel: Channel, user: User, *, capped: bool = False) -> bool:
    """Make `user` a member of `channel`; return False when they already were.

    `capped`: raise LimitReached, adding nothing, when the user already belongs to
    RELAY_MAX_CHANNELS_PER_USER channels or the channel has RELAY_MAX_MEMBERS_PER_CHANNEL members.
    """
    try:
        with transaction.atomic():
            if capped:
                _hold_to_the_caps(channel, user)
            Membership.objects.create(channel=channel, user=user)
    except IntegrityError:
        return False
    return True


def _hold_to_the_caps(channel: Channel, user: User) -> None:
    # The user's row, then the channel's, locked in that order by every capped add: concurrent
    # adds to one user or one channel are counted one after the other, and never deadlock.
    list(User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True))
    list(Channel.objects.select_for_update().filter(pk=channel.pk).values_list("pk", flat=True))
    if Membership.objects.filter(channel=channel, user=user).exists():
        return  # already a member: the create below answers that
    if Membership.objects.filter(user=user).count() >= settings.RELAY_MAX_CHANNELS_PER_USER:
        raise LimitReached("RELAY_MAX_CHANNELS_PER_USER", settings.RELAY_MAX_CHANNELS_PER_USER)
    if Membership.objects.filter(channel=channel).count() >= settings.RELAY_MAX_MEMBERS_PER_CHANNEL:
        raise LimitReached("RELAY_MAX_MEMBERS_PER_CHANNEL", settings.RELAY_MAX_MEMBERS_PER_CHANNEL)


def remove_member(channel: Channel, user: User) -> bool:
    """End `user`'s membership of `channel`; return False when there was none."""
    deleted, _ = Membership.objects.filter(channel=channel, user=user).delete()
    return bool(deleted)


# Every way a membership changes (the API, admin forms and bulk deletes, a user or channel
# deleted with its memberships, the shell) reaches the live connections through these
# receivers, once the change is committed: a connection reacting to it never reads the old
# state, and a rolled-back change is never announced. bulk_create() sends no signal: it is
# for building worlds nobody is connected to (setupdemo, the benchmark).


@receiver(pre_save, sender=Membership)
def _remember_the_old_pair(sender: type, instance: Membership, **kwargs: object) -> None:
    instance._old_pair = (
        Membership.objects.filter(pk=instance.pk).values_list("user_id", "channel_id").first() if instance.pk else None
    )


@receiver(post_save, sender=Membership)
def _saved(sender: type, instance: Membership, created: bool, **kwargs: object) -> None:
    old = getattr(instance, "_old_pair", None)
    if old == (instance.user_id, instance.channel_id):
        return
    if old is not None:
        old_user, old_channel = old
        transaction.on_commit(functools.partial(_removed, old_user, old_channel, _bump(old_user)))
    added = functools.partial(
        _added, instance.channel, instance.user, instance.pk if old is None else None, _bump(instance.user_id)
    )
    transaction.on_commit(added)


@receiver(post_delete, sender=Membership)
def _deleted(sender: type, instance: Membership, **kwargs: object) -> None:
    version = _bump(instance.user_id)
    transaction.on_commit(functools.partial(_removed, instance.user_id, instance.channel_id, version))


def _bump(user_pk: int) -> int | None:
    """Bump the user's membership version inside the change's transaction; return the new one.

    The UPDATE holds the user's row until the commit, so the version read back is this change's
    own, and changes to one user's memberships are numbered in their commit order. None when
    the user is gone with it (a cascade).
    """
    users = User.objects.filter(pk=user_pk)
    users.update(membership_version=F("membership_version") + 1)
    return users.values_list("membership_version", flat=True).first()


def _added(channel: Channel, user: User, membership_id: int | None, version: int | None) -> None:
    _notify(user.pk, channel.pk, True, version)
    _listeners_ran(member_added.send_robust(sender=Membership, channel=channel, user=user, membership_id=membership_id))


def _removed(user_pk: int, channel_id: uuid.UUID, version: int | None) -> None:
    _notify(user_pk, channel_id, False, version)
    if version is not None:  # None: the user went with it, and nobody is connected as them
        _listeners_ran(member_removed.send_robust(sender=Membership, channel_id=str(channel_id), user_pk=user_pk))


def _listeners_ran(outcomes: list[tuple[object, object]]) -> None:
    for _, outcome in outcomes:
        # The change stands whatever a listener does: it is durable and already made.
        if isinstance(outcome, Exception):
            log_event(logger, Event.MEMBERSHIP_LISTENER_FAILED, logging.ERROR, error=type(outcome).__name__)


def _notify(user_pk: int, channel_id: uuid.UUID, member: bool, version: int | None) -> None:
    # A lost notice (a channel-layer fault, a process that died before this ran) leaves the
    # change made (it is durable, and so is its version) and the live connections to pick it up
    # at their instance's next reconciliation (relay/reconcile.py).
    if version is None:
        return  # no such user any more: nobody is connected as them
    try:
        publish_notice(
            MEMBERSHIP_GROUP,
            {"type": EVENT, "user": user_pk, "channel": str(channel_id), "member": member, "version": version},
        )
    except Exception as error:
        log_event(logger, Event.MEMBERSHIP_NOTIFY_FAILED, logging.ERROR, error=type(error).__name__)


@dataclass
class Applied:
    """What one connection has applied of its user's membership changes, to order what comes next.

    Notices and reads arrive out of order: a read that started before a change committed can be
    applied after the change's notice, and two instances' notices race each other. Each carries
    the user's membership version, so:

    1. a read older than the last read applied is dropped;
    2. a notice no newer than the last read applied, or than the last notice about its channel,
       is dropped (the read or that notice already says more);
    3. a read is applied with every newer notice already applied laid back over it.
    """

    # The version of the last full read applied; -1 before the first.
    read: int = -1
    # The channels' notices applied since that read: channel id -> (version, member).
    notices: dict[str, tuple[int, bool]] = field(default_factory=dict)

    def notice(self, channel_id: str, member: bool, version: int) -> bool:
        """Record a notice; False when it is older than what was applied (drop it)."""
        if version <= self.read or version <= self.notices.get(channel_id, (-1, False))[0]:
            return False
        self.notices[channel_id] = (version, member)
        return True

    def sync(self, channel_ids: set[str], version: int) -> set[str] | None:
        """The channels to hold after a read at `version`; None when the read is older than what was applied."""
        if version <= self.read:
            return None
        self.read = version
        self.notices = {key: seen for key, seen in self.notices.items() if seen[0] > version}
        channels = set(channel_ids)
        for channel_id, (_, member) in self.notices.items():
            if member:
                channels.add(channel_id)
            else:
                channels.discard(channel_id)
        return channels
