"""The connect path's three reads, in plain SQL: the token's user, their channels, their co-members.

Every WebSocket connect runs them. Through the ORM they cost ≈ 700 µs of CPU together on the
benchmark's SQLite database, almost all of it building and compiling the queries; as fixed SQL
they cost ≈ 100 µs (docs/performance.md). Table and column names come from the models, and
parameters and UUID results go through the fields' own conversions, so SQLite and PostgreSQL
read the same.
"""

import uuid
from collections.abc import Collection

from django.db import connection

from relay.models import Channel, Membership, User

_USER = User._meta.db_table
_MEMBERSHIP = Membership._meta.db_table
_CHANNEL = Channel._meta.db_table
_UUID_FIELD = Channel._meta.pk

# What a connection needs of its user; the rest of the row is loaded only if something reads it.
_USER_SQL = f'SELECT "id", "external_id" FROM "{_USER}" WHERE "environment_id" = %s AND "external_id" = %s'
_CHANNELS_SQL = f'SELECT "channel_id" FROM "{_MEMBERSHIP}" WHERE "user_id" = %s'


def _param(value: str | uuid.UUID) -> object:
    """A UUID as the database stores it (hex text on SQLite, a uuid on PostgreSQL)."""
    return _UUID_FIELD.get_db_prep_value(value if isinstance(value, uuid.UUID) else uuid.UUID(value), connection)


def _text(value: object) -> str:
    """A UUID read back from the database, as the canonical text the rest of Relay uses."""
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))


def user_by_external_id(environment_id: uuid.UUID, external_id: str) -> User | None:
    """The environment's user with this id, or None (the unique index answers with one row).

    Only the primary key and the ids are read, as `.only()` would: the row's other fields load
    on first access. (Manager.raw() with every column cost ≈ 80 µs a connect, most of it the
    fields' converters; the id and the environment need none.)
    """
    with connection.cursor() as cursor:
        cursor.execute(_USER_SQL, [_param(environment_id), external_id])
        row = cursor.fetchone()
    if row is None:
        return None
    pk, external_id = row
    # from_db() takes the values in the model's field order.
    return User.from_db(connection.alias, ["id", "environment_id", "external_id"], [pk, environment_id, external_id])


def channel_ids_of_user(user_pk: int) -> set[str]:
    """The ids of the channels the user is a member of."""
    with connection.cursor() as cursor:
        cursor.execute(_CHANNELS_SQL, [user_pk])
        return {_text(row[0]) for row in cursor.fetchall()}


def co_member_external_ids(environment_id: uuid.UUID | str, channel_ids: Collection[str]) -> set[str]:
    """The external ids of the environment's users who are members of any of `channel_ids`."""
    if not channel_ids:
        return set()
    placeholders = ", ".join(["%s"] * len(channel_ids))
    # From the memberships of those channels (their index), never from the environment's users:
    # the planner would otherwise walk every user of the tenant. The channel's environment is
    # checked so a foreign channel id can never list another tenant's users.
    sql = (
        f'SELECT DISTINCT u."external_id" FROM "{_MEMBERSHIP}" m '
        f'JOIN "{_USER}" u ON u."id" = m."user_id" '
        f'JOIN "{_CHANNEL}" c ON c."id" = m."channel_id" '
        f'WHERE m."channel_id" IN ({placeholders}) AND c."environment_id" = %s'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*(_param(channel_id) for channel_id in channel_ids), _param(environment_id)])
        return {row[0] for row in cursor.fetchall()}
