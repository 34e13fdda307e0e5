"""The connect path's reads, in plain SQL: the tokens' users and their channels.

Every WebSocket connect needs them, and through the ORM building and compiling the queries cost
several times the reads themselves (docs/performance.md). Each read takes a whole batch of
connects (the ones sharing a database hop, relay.connect_reads): one query per table for the batch,
not one per connect. Table and column names come from the models, and parameters and UUID
results go through the fields' own conversions, so SQLite and PostgreSQL read the same.
"""

import functools
import uuid
from collections.abc import Collection

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper

from relay.models import Channel, Membership, User

_USER = User._meta.db_table
_MEMBERSHIP = Membership._meta.db_table
_UUID_FIELD = Channel._meta.pk


def db_uuid(value: str | uuid.UUID, db: BaseDatabaseWrapper) -> object:
    """A UUID as `db` stores it (hex text on SQLite, a uuid on PostgreSQL).

    `db` is the cursor's: `django.db.connection` is a proxy that looks the connection up in
    thread-local storage on every use (≈ 1 µs), and a read converts a parameter per channel.
    """
    return _UUID_FIELD.get_db_prep_value(value if isinstance(value, uuid.UUID) else uuid.UUID(value), db)


@functools.lru_cache(maxsize=8192)
def uuid_text(value: object) -> str:
    """A UUID read back from the database, as the canonical text the rest of Relay uses.

    Remembered: a connect converts its environment's id and its channels' ids, ≈ 2 µs each, and
    a process reads the same few again and again (every member of a channel, every connect of a
    tenant).
    """
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))


def placeholders(count: int) -> str:
    """`%s, %s, ...`: one parameter placeholder per value of an IN list."""
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
        f'WHERE "environment_id" = %s AND "external_id" IN ({placeholders(len(external_ids))})'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [db_uuid(environment_id, cursor.db), *external_ids])
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
    sql = f'SELECT "user_id", "channel_id" FROM "{_MEMBERSHIP}" WHERE "user_id" IN ({placeholders(len(user_pks))})'
    found: dict[int, set[str]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, list(user_pks))
        rows = cursor.fetchall()
    # Once per channel, as in members_of_channels: the batch's users often share their channels.
    texts = {channel_id: uuid_text(channel_id) for channel_id in {channel_id for _, channel_id in rows}}
    for user_pk, channel_id in rows:
        found.setdefault(user_pk, set()).add(texts[channel_id])
    return found


def channel_ids_of_user(user_pk: int) -> set[str]:
    """The ids of the channels the user is a member of."""
    return channel_ids_of_users([user_pk]).get(user_pk, set())
