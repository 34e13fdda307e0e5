"""The connect path's reads, in plain SQL: the tokens' users, their channels, those channels' members.

Every WebSocket connect needs them. Through the ORM they cost ≈ 700 µs of CPU together on the
benchmark's SQLite database, almost all of it building and compiling the queries; as fixed SQL
they cost ≈ 100 µs (docs/performance.md). Each read takes a whole batch of connects (the ones
sharing a database hop, relay.consumers): one query per table for the batch, not one per connect.
Table and column names come from the models, and parameters and UUID results go through the
fields' own conversions, so SQLite and PostgreSQL read the same.
"""

import functools
import uuid
from collections.abc import Collection

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper

from relay.models import Channel, Membership, User

_USER = User._meta.db_table
_MEMBERSHIP = Membership._meta.db_table
_CHANNEL = Channel._meta.db_table
_UUID_FIELD = Channel._meta.pk


def _param(value: str | uuid.UUID, db: BaseDatabaseWrapper) -> object:
    """A UUID as `db` stores it (hex text on SQLite, a uuid on PostgreSQL).

    `db` is the cursor's: `django.db.connection` is a proxy that looks the connection up in
    thread-local storage on every use (≈ 1 µs), and a read converts a parameter per channel.
    """
    return _UUID_FIELD.get_db_prep_value(value if isinstance(value, uuid.UUID) else uuid.UUID(value), db)


@functools.lru_cache(maxsize=8192)
def _text(value: object) -> str:
    """A UUID read back from the database, as the canonical text the rest of Relay uses.

    Remembered: a connect converts its environment's id and its channels' ids, ≈ 2 µs each, and
    a process reads the same few again and again (every member of a channel, every connect of a
    tenant).
    """
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def users_by_external_id(environment_id: uuid.UUID, external_ids: Collection[str]) -> dict[str, User]:
    """The environment's users with these ids, by id (one query, on the unique index).

    Only the primary key and the ids are read, as `.only()` would: the rows' other fields load
    on first access. (Manager.raw() with every column cost ≈ 80 µs a connect, most of it the
    fields' converters; the id and the environment need none.)
    """
    if not external_ids:
        return {}
    sql = (
        f'SELECT "id", "external_id" FROM "{_USER}" '
        f'WHERE "environment_id" = %s AND "external_id" IN ({_placeholders(len(external_ids))})'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [_param(environment_id, cursor.db), *external_ids])
        rows = cursor.fetchall()
        alias = cursor.db.alias
    # from_db() takes the values in the model's field order.
    fields = ["id", "environment_id", "external_id"]
    return {external_id: User.from_db(alias, fields, [pk, environment_id, external_id]) for pk, external_id in rows}


def user_by_external_id(environment_id: uuid.UUID, external_id: str) -> User | None:
    """The environment's user with this id, or None."""
    return users_by_external_id(environment_id, [external_id]).get(external_id)


def channel_ids_of_users(user_pks: Collection[int]) -> dict[int, set[str]]:
    """The ids of the channels each user is a member of; a user in none is left out."""
    if not user_pks:
        return {}
    sql = f'SELECT "user_id", "channel_id" FROM "{_MEMBERSHIP}" WHERE "user_id" IN ({_placeholders(len(user_pks))})'
    found: dict[int, set[str]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, list(user_pks))
        rows = cursor.fetchall()
    # Once per channel, as in members_of_channels: the batch's users often share their channels.
    texts = {channel_id: _text(channel_id) for channel_id in {channel_id for _, channel_id in rows}}
    for user_pk, channel_id in rows:
        found.setdefault(user_pk, set()).add(texts[channel_id])
    return found


def channel_ids_of_user(user_pk: int) -> set[str]:
    """The ids of the channels the user is a member of."""
    return channel_ids_of_users([user_pk]).get(user_pk, set())


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
        f'WHERE m."channel_id" IN ({_placeholders(len(channel_ids))})'
    )
    # Keyed by the ids as the database returns them, converted once per channel and not once per
    # member row: a channel of thousands would otherwise cost thousands of UUID conversions.
    found: dict[object, tuple[object, set[str]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [_param(channel_id, cursor.db) for channel_id in channel_ids])
        for channel_id, environment_id, external_id in cursor.fetchall():
            entry = found.get(channel_id)
            if entry is None:
                entry = found[channel_id] = (environment_id, set())
            entry[1].add(external_id)
    return {
        _text(channel_id): (_text(environment_id), members) for channel_id, (environment_id, members) in found.items()
    }


def co_members_in(
    members: dict[str, tuple[str, set[str]]], environment_id: uuid.UUID | str, channel_ids: Collection[str]
) -> set[str]:
    """The external ids of the environment's users in any of `channel_ids`, from `members_of_channels`.

    A channel of another environment counts for nothing, so a foreign channel id can never list
    another tenant's users.
    """
    environment = _text(environment_id)
    found: set[str] = set()
    for channel_id in channel_ids:
        entry = members.get(channel_id)
        if entry is not None and entry[0] == environment:
            found |= entry[1]
    return found


def co_member_external_ids(environment_id: uuid.UUID | str, channel_ids: Collection[str]) -> set[str]:
    """The external ids of the environment's users who are members of any of `channel_ids`."""
    return co_members_in(members_of_channels(channel_ids), environment_id, channel_ids)
