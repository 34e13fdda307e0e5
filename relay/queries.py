"""The connect path's reads, in plain SQL: the tokens' users and their channels.

Every WebSocket connect needs them, and through the ORM building and compiling the queries cost
several times the reads themselves (docs/performance.md). Each read takes a whole batch of
connects (the ones sharing a database hop, relay.connect_reads): one query per table for the batch,
not one per connect. Table and column names come from the models, and parameters and UUID
results go through the fields' own conversions, so SQLite and PostgreSQL read the same.
"""

import functools
import uuid
from collections.abc import Collection, Iterator
from typing import TypeVar

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper

from relay.models import Channel, Membership, User

_USER = User._meta.db_table
_MEMBERSHIP = Membership._meta.db_table
_UUID_FIELD = Channel._meta.pk

T = TypeVar("T")


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


# The longest IN list one query carries: far below SQLite's 32,766 and PostgreSQL's 65,535
# parameters, so a round over every connection of a large instance is a few queries, never an error.
IN_LIST_MAX = 5000


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


def chunks(values: Collection[T], size: int = IN_LIST_MAX) -> Iterator[list[T]]:
    """`values` in lists of at most `size`, one per query."""
    ordered = list(values)
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


def _fetch_in(sql: str, values: Collection[object]) -> list[tuple]:
    """Every row of `sql` (whose `{}` is an IN list) for `values`, a query per chunk of them."""
    rows: list[tuple] = []
    with connection.cursor() as cursor:
        for chunk in chunks(values):
            cursor.execute(sql.format(placeholders(len(chunk))), chunk)
            rows.extend(cursor.fetchall())
    return rows


def channel_ids_of_users(user_pks: Collection[int]) -> dict[int, set[str]]:
    """The ids of the channels each user is a member of; a user in none is left out."""
    rows = _fetch_in(f'SELECT "user_id", "channel_id" FROM "{_MEMBERSHIP}" WHERE "user_id" IN ({{}})', user_pks)
    found: dict[int, set[str]] = {}
    # Once per channel, as in members_of_channels: the batch's users often share their channels.
    texts = {channel_id: uuid_text(channel_id) for channel_id in {channel_id for _, channel_id in rows}}
    for user_pk, channel_id in rows:
        found.setdefault(user_pk, set()).add(texts[channel_id])
    return found


def channel_ids_of_user(user_pk: int) -> set[str]:
    """The ids of the channels the user is a member of."""
    return channel_ids_of_users([user_pk]).get(user_pk, set())


def membership_versions(user_pks: Collection[int]) -> dict[int, int]:
    """Each existing user's membership version (relay/models.py, `User.membership_version`)."""
    return dict(_fetch_in(f'SELECT "id", "membership_version" FROM "{_USER}" WHERE "id" IN ({{}})', user_pks))


def versioned_channel_ids(user_pks: Collection[int]) -> dict[int, tuple[int, set[str]]]:
    """Each existing user's membership version and channel ids, read together.

    One statement per chunk of users, so one snapshot: the channels are exactly those of the
    version, which is what lets a connection order this read against the changes' notices.
    """
    sql = (
        f'SELECT "u"."id", "u"."membership_version", "m"."channel_id" FROM "{_USER}" "u" '
        f'LEFT JOIN "{_MEMBERSHIP}" "m" ON "m"."user_id" = "u"."id" WHERE "u"."id" IN ({{}})'
    )
    found: dict[int, tuple[int, set[str]]] = {}
    for user_pk, version, channel_id in _fetch_in(sql, user_pks):
        _, channels = found.setdefault(user_pk, (version, set()))
        if channel_id is not None:
            channels.add(uuid_text(channel_id))
    return found
