"""Presence's reads of the database, in plain SQL: channels' members and a user's channels.

A connect's snapshot needs the members of every channel of the user; read for a whole batch of
connects at once (the connects' shared database hop, `PresenceExtension.load`), one query.
"""

import uuid
from collections.abc import Collection
from datetime import UTC, datetime

from django.db import connection

from presence.models import UserStatus
from relay.models import Channel, Environment, Membership, User
from relay.queries import db_uuid, placeholders, uuid_text

_USER = User._meta.db_table
_MEMBERSHIP = Membership._meta.db_table
_CHANNEL = Channel._meta.db_table
_ENVIRONMENT = Environment._meta.db_table


def channel_ids_of_member(environment_id: str, external_id: str) -> set[str]:
    """The channel ids of one tenant's user, by their external id (empty when unknown): one query.

    Every grace check reads it, so it is not built through the ORM, whose query compiling cost
    several times the read itself.
    """
    sql = (
        f'SELECT m."channel_id" FROM "{_MEMBERSHIP}" m JOIN "{_USER}" u ON u."id" = m."user_id" '
        f'WHERE u."environment_id" = %s AND u."external_id" = %s'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [db_uuid(environment_id, cursor.db), external_id])
        return {uuid_text(channel_id) for (channel_id,) in cursor.fetchall()}


def channel_ids_of_members(subjects: Collection[tuple[str, str]]) -> dict[tuple[str, str], set[str]]:
    """The channel ids of each (environment id, external id): one query per environment."""
    found: dict[tuple[str, str], set[str]] = {subject: set() for subject in subjects}
    by_environment: dict[str, list[str]] = {}
    for environment_id, external_id in subjects:
        by_environment.setdefault(environment_id, []).append(external_id)
    for environment_id, external_ids in by_environment.items():
        pairs = Membership.objects.filter(
            user__environment_id=environment_id, user__external_id__in=external_ids
        ).values_list("user__external_id", "channel_id")
        for external_id, channel_id in pairs:
            found[(environment_id, external_id)].add(str(channel_id))
    return found


def members_of_channels(channel_ids: Collection[str]) -> dict[str, tuple[str, set[str]]]:
    """Each channel's environment id and its members' external ids; unknown channels are left out.

    Read from the memberships of those channels (their index), never from the environments'
    users: the planner would otherwise walk every user of a tenant.
    """
    if not channel_ids:
        return {}
    sql = (
        f'SELECT m."channel_id", c."environment_id", u."external_id" FROM "{_MEMBERSHIP}" m '
        f'JOIN "{_USER}" u ON u."id" = m."user_id" '
        f'JOIN "{_CHANNEL}" c ON c."id" = m."channel_id" '
        f'WHERE m."channel_id" IN ({placeholders(len(channel_ids))})'
    )
    # Keyed by the ids as the database returns them, converted once per channel and not once per
    # member row: a channel of thousands would otherwise cost thousands of UUID conversions.
    found: dict[object, tuple[object, set[str]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [db_uuid(channel_id, cursor.db) for channel_id in channel_ids])
        for channel_id, environment_id, external_id in cursor.fetchall():
            entry = found.get(channel_id)
            if entry is None:
                entry = found[channel_id] = (environment_id, set())
            entry[1].add(external_id)
    return {
        uuid_text(channel_id): (uuid_text(environment_id), members)
        for channel_id, (environment_id, members) in found.items()
    }


def co_members_in(
    members: dict[str, tuple[str, set[str]]], environment_id: uuid.UUID | str, channel_ids: Collection[str]
) -> set[str]:
    """The external ids of the environment's users in any of `channel_ids`, from `members_of_channels`.

    A channel of another environment counts for nothing, so a foreign channel id can never list
    another tenant's users.
    """
    environment = uuid_text(environment_id)
    found: set[str] = set()
    for channel_id in channel_ids:
        entry = members.get(channel_id)
        if entry is not None and entry[0] == environment:
            found |= entry[1]
    return found


def co_member_external_ids(environment_id: uuid.UUID | str, channel_ids: Collection[str]) -> set[str]:
    """The external ids of the environment's users who are members of any of `channel_ids`."""
    return co_members_in(members_of_channels(channel_ids), environment_id, channel_ids)


def members_seeing_only(
    environment_id: str, user_id: str, channel_ids: Collection[str], other_channel_ids: Collection[str]
) -> list[str]:
    """The members of `channel_ids` who share none of `other_channel_ids` with the user (not the user)."""
    members = co_member_external_ids(environment_id, channel_ids)
    already = co_member_external_ids(environment_id, other_channel_ids) if members and other_channel_ids else set()
    return sorted(members - already - {user_id})


def large_channel_ids(channel_ids: Collection[str]) -> set[str]:
    """Those of `channel_ids` with more members than their environment's `large_room_members`: one query.

    Counted on the membership index in the database; nothing in the instance or in Redis grows
    with the channel.
    """
    if not channel_ids:
        return set()
    sql = (
        f'SELECT m."channel_id" FROM "{_MEMBERSHIP}" m JOIN "{_CHANNEL}" c ON c."id" = m."channel_id" '
        f'JOIN "{_ENVIRONMENT}" e ON e."id" = c."environment_id" '
        f'WHERE m."channel_id" IN ({placeholders(len(channel_ids))}) '
        f'GROUP BY m."channel_id", e."large_room_members" HAVING COUNT(*) > e."large_room_members"'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [db_uuid(channel_id, cursor.db) for channel_id in channel_ids])
        return {uuid_text(channel_id) for (channel_id,) in cursor.fetchall()}


def is_invisible(environment_id: str, external_id: str) -> bool:
    """Whether the user chose to be invisible (the table is the truth; Redis holds a copy)."""
    return UserStatus.objects.filter(
        user__environment_id=environment_id, user__external_id=external_id, invisible=True
    ).exists()


def invisible_users(environment_id: str, external_ids: Collection[str]) -> set[str]:
    """Which of the environment's `external_ids` are invisible (they read as offline to others)."""
    if not external_ids:
        return set()
    return set(
        UserStatus.objects.filter(
            user__environment_id=environment_id, user__external_id__in=list(external_ids), invisible=True
        ).values_list("user__external_id", flat=True)
    )


def mark_last_seen(subjects: Collection[tuple[str, str]], at: float) -> None:
    """Record that each (environment id, user id) was last seen at `at` (unix seconds).

    Not for invisible users: what others may be told is when they turned invisible, kept then.
    """
    when = datetime.fromtimestamp(at, tz=UTC)
    by_environment: dict[str, list[str]] = {}
    for environment_id, user_id in subjects:
        by_environment.setdefault(environment_id, []).append(user_id)
    for environment_id, user_ids in by_environment.items():
        users = list(
            User.objects.filter(environment_id=environment_id, external_id__in=user_ids).values_list("pk", flat=True)
        )
        UserStatus.objects.filter(user_id__in=users, invisible=False).update(last_seen_at=when)
        existing = set(UserStatus.objects.filter(user_id__in=users).values_list("user_id", flat=True))
        UserStatus.objects.bulk_create(
            [UserStatus(user_id=pk, last_seen_at=when) for pk in users if pk not in existing], ignore_conflicts=True
        )
