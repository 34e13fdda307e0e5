"""Presence reads: the connection snapshot, a channel's online members, online flags for admin.

All answered from the presence keys (one MGET each) and never from a table: presence is
ephemeral, and the keys are the only place it lives.
"""

from collections.abc import Collection, Sequence

from channels.db import database_sync_to_async
from django.db.models import Exists, OuterRef

from presence import actions
from presence.queries import co_member_external_ids, co_members_in, invisible_users, members_of_channels
from presence.store import online_flags
from relay.frames import PresenceChanged
from relay.models import Channel, Membership, User
from relay.registry import Connection


def co_member_ids(environment_id: str, user_id: str, channel_ids: Collection[str]) -> list[str]:
    """The ids of the environment's users sharing at least one of `channel_ids`, and the user."""
    return co_member_ids_of([(environment_id, user_id, channel_ids)])[0]


def co_member_ids_of(requests: Sequence[tuple[str, str, Collection[str]]]) -> list[list[str]]:
    """`co_member_ids` of each (environment id, user id, channel ids), from one read of all the channels."""
    members = members_of_channels({channel_id for _, _, channel_ids in requests for channel_id in channel_ids})
    return [
        sorted(co_members_in(members, environment_id, channel_ids) | {user_id})
        for environment_id, user_id, channel_ids in requests
    ]


co_members = database_sync_to_async(co_member_ids)
invisible_among = database_sync_to_async(invisible_users, thread_sensitive=False)


def newly_visible_ids(
    environment_id: str, user_id: str, channel_id: str, other_channel_ids: Collection[str]
) -> list[str]:
    """The members of `channel_id` the user shares none of `other_channel_ids` with (not the user)."""
    members = co_member_external_ids(environment_id, [channel_id])
    already = co_member_external_ids(environment_id, other_channel_ids) if members else set()
    return sorted(members - already - {user_id})


newly_visible = database_sync_to_async(newly_visible_ids)


def members_newly_seeing(environment_id: str, user: User, channel_id: str, membership_id: int | None) -> list[str]:
    """The members of `channel_id` who could not see `user` before this membership (no other shared channel).

    With `membership_id`, the new row's id, "before" is by membership id on both sides: a
    membership counts only if it was made before this one. Two additions committed together
    (two channels in one transaction, or two requests racing) that make the same pair visible
    are then judged in the order they were made, and the pair is told once, by the first,
    instead of each finding the other and neither telling. Without it (an existing row moved to
    this pair, which has no place in that order), every other membership counts. A membership
    removed or moved again before this runs makes nobody newly visible.
    """
    before = {} if membership_id is None else {"id__lt": membership_id}
    if before and not Membership.objects.filter(pk=membership_id, user=user, channel_id=channel_id).exists():
        return []  # removed (or moved) again since
    # X and the user in the same other channel, both memberships made before this one (one
    # filter() call: the conditions on `channel__memberships` describe the same row).
    shared_before = Membership.objects.filter(
        user_id=OuterRef("user_id"),
        channel__memberships__user_id=user.pk,
        **before,
        **{f"channel__memberships__{lookup}": value for lookup, value in before.items()},
    ).exclude(channel_id=channel_id)
    members = (
        Membership.objects.filter(channel_id=channel_id, channel__environment_id=environment_id, **before)
        .exclude(user_id=user.pk)
        .exclude(Exists(shared_before))
        .values_list("user__external_id", flat=True)
    )
    return sorted(members)


async def announce_new_co_members(conn: Connection, channel_id: str) -> None:
    """Tell a connection whose user just joined `channel_id` who it made visible and is online.

    Without this the client's state would miss them until their next transition, and "snapshot
    + changes ends with the true state" would not hold across a membership change. The
    connection joined the channel's presence group before this read (the consumer's
    `membership_changed`), so a transition racing it is queued behind these frames, as one
    racing the connect's snapshot is behind the snapshot. Users already visible through another
    shared channel are left out: the client already knows their state.
    """
    others = set(conn.channel_ids) - {channel_id}
    candidates = await newly_visible(conn.environment_id, conn.user_id, channel_id, others)
    # None (the presence Redis down, logged by the store): nothing to tell; the next transitions will.
    online = await actions.service().store.online(conn.environment_id, candidates) or []
    hidden = await invisible_among(conn.environment_id, online)
    for user_id in online:
        if user_id not in hidden:
            await conn.send_frame("presence.changed", PresenceChanged(user=user_id, state="online"))


async def snapshot(conn: Connection) -> list[str]:
    """Who among the connection's co-members (and the user) is online now, sorted.

    The fallback for a connection whose co-members the connect's database hop could not read
    (normally the election's own round trip reads them: presence/extension.py). The connection
    joined its presence groups in `admit`, before this read, so a transition racing the snapshot
    is queued behind it and applied after it: snapshot + changes converge. With the presence
    Redis down the snapshot is empty (and the failure logged): the socket still opens, and the
    next transitions fill it in.
    """
    candidates = await co_members(conn.environment_id, conn.user_id, set(conn.channel_ids))
    online = await actions.service().store.online(conn.environment_id, candidates)
    return sorted(online or [])


def online_in_channel(channel: Channel) -> list[str] | None:
    """The ids of the channel's members online now, sorted; None when Redis does not answer."""
    environment_id = str(channel.environment_id)
    members = list(channel.members.order_by("external_id").values_list("external_id", flat=True))
    flags = online_flags([(environment_id, user_id) for user_id in members], op="channel_presence")
    if flags is None:
        return None
    online = [user_id for user_id, online in zip(members, flags, strict=True) if online]
    hidden = invisible_users(environment_id, online)
    return [user_id for user_id in online if user_id not in hidden]


def users_online(users: Sequence[User]) -> list[bool] | None:
    """Whether each of `users` is online now, in one round trip; None when Redis does not answer."""
    return online_flags([(str(user.environment_id), user.external_id) for user in users], op="admin")
