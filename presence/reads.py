"""Presence reads: the connection snapshot, a channel's online members, online flags for admin.

All answered from the presence keys (one MGET each) and never from a table: presence is
ephemeral, and the keys are the only place it lives.
"""

import time
from collections.abc import Collection, Sequence

import redis
from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Exists, OuterRef, Value
from django.db.models.functions import Greatest
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from presence import actions
from presence.delivery import VIEW_KEY
from presence.queries import co_members_in, invisible_users, members_of_channels
from presence.scripts import presence_key
from presence.store import as_text, client_options, record_failure
from relay import metrics, redis_clients
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


def newly_visible_ids(environment_id: str, user_id: str, channel_id: str) -> list[str]:
    """The members of `channel_id` the user's membership of it made visible to them (not the user).

    Judged by membership id, as `members_newly_seeing` judges the other side: a member is left
    out when they and the user shared another channel before both were in this one (both
    memberships there older than the later of the two here). Judged by what they share now, a
    member added since to another of the user's channels would be left out here, while that
    addition leaves the pair to this one, made first: neither would tell. Nobody once the
    membership is gone.
    """
    own = (
        Membership.objects.filter(channel_id=channel_id, user__external_id=user_id, user__environment_id=environment_id)
        .values_list("pk", "user_id")
        .first()
    )
    if own is None:
        return []
    own_id, user_pk = own
    both_here = Greatest(Value(own_id), OuterRef("pk"))
    # One filter() call: the conditions on `channel__memberships` describe the same row.
    shared_before = Membership.objects.filter(
        user_id=OuterRef("user_id"),
        channel__memberships__user_id=user_pk,
        pk__lt=both_here,
        channel__memberships__pk__lt=both_here,
    ).exclude(channel_id=channel_id)
    members = (
        Membership.objects.filter(channel_id=channel_id)
        .exclude(user_id=user_pk)
        .exclude(Exists(shared_before))
        .values_list("user__external_id", flat=True)
    )
    return sorted(members)


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


async def announce_new_co_members(conn: Connection, channel_id: str, exclude: Collection[str] = ()) -> list[str] | None:
    """Tell a connection whose user just joined `channel_id` who it made visible and is online.

    Without this the client's state would miss them until their next transition, and "snapshot
    + changes ends with the true state" would not hold across a membership change. The
    connection joined the channel's presence group before this read (the consumer's
    `membership_changed`), so a transition racing it is queued behind these frames, as one
    racing the connect's snapshot is behind the snapshot. Users the channel did not make visible
    (`newly_visible_ids`) are left out: the client already knows their state, as are `exclude`
    (told by an earlier read). Returns who was told; None when the presence Redis did not answer
    (logged by the store): nothing was told, and the caller owes it.
    """
    candidates = await newly_visible(conn.environment_id, conn.user_id, channel_id)
    online = await actions.service().store.online(conn.environment_id, candidates)
    hidden = await invisible_among(conn.environment_id, online or [])
    view = conn.state.get(VIEW_KEY)  # kept while a repair is due (presence/extension.py)
    told = [user_id for user_id in online or () if user_id not in hidden and user_id not in exclude]
    for user_id in told:
        if view is not None:
            view.add(user_id)
        await conn.send_frame("presence.changed", PresenceChanged(user=user_id, state="online"))
    return None if online is None else told


async def snapshot(conn: Connection) -> list[str] | None:
    """Who among the connection's co-members (and the user) is online now, sorted; None when Redis did not answer.

    The connection's first snapshot when the connect's database hop could not read its
    co-members (normally the election's own round trip reads them: presence/extension.py), and
    the repair of one Redis could not read. The connection joined its presence groups before
    this read, so a transition racing it is queued behind it and applied after it: snapshot +
    changes converge.
    """
    candidates = await co_members(conn.environment_id, conn.user_id, set(conn.channel_ids))
    online = await actions.service().store.online(conn.environment_id, candidates)
    return None if online is None else sorted(online)


# Members whose flags one MGET reads while a page of online members is gathered.
MEMBERS_PER_READ = 1000


def online_page(channel: Channel, after: str | None, limit: int) -> tuple[list[str], str | None] | None:
    """Up to `limit` of the channel's online members after `after`, in id order, and the next page's `after`.

    Members are walked in the database's order of their ids, `MEMBERS_PER_READ` at a time (one
    MGET each), until the page is full; the next page's `after` is None once no member is left
    behind the page. Invisible users read as offline: they take no place in a page. None when
    Redis does not answer.
    """
    environment_id = str(channel.environment_id)
    members = channel.members.order_by("external_id").values_list("external_id", flat=True)
    online: list[str] = []
    while True:
        chunk = list((members.filter(external_id__gt=after) if after is not None else members)[:MEMBERS_PER_READ])
        flags = online_flags([(environment_id, user_id) for user_id in chunk], op="channel_presence")
        if flags is None:
            return None
        seen = [user_id for user_id, is_online in zip(chunk, flags, strict=True) if is_online]
        hidden = invisible_users(environment_id, seen)
        for index, (user_id, is_online) in enumerate(zip(chunk, flags, strict=True)):
            if not is_online or user_id in hidden:
                continue
            online.append(user_id)
            if len(online) == limit:
                behind = index + 1 < len(chunk) or members.filter(external_id__gt=user_id).exists()
                return online, user_id if behind else None
        if len(chunk) < MEMBERS_PER_READ:
            return online, None
        after = chunk[-1]


def users_online(users: Sequence[User]) -> list[bool] | None:
    """Whether each of `users` is online now, in one round trip; None when Redis does not answer."""
    return online_flags([(str(user.environment_id), user.external_id) for user in users], op="admin")


# ── the blocking reads of HTTP views and admin (they run in threads) ────────────

_sync_clients: dict[tuple[str, tuple], redis.Redis | RedisCluster] = {}


def sync_client() -> redis.Redis | RedisCluster:
    """The process's blocking presence client (HTTP views and admin run in threads).

    A `RedisCluster` when presence runs on one (RELAY_PRESENCE_CLUSTER_NODES): each command goes
    to the master of its key's slot.
    """
    url, nodes = settings.RELAY_PRESENCE_REDIS_URL, tuple(settings.RELAY_PRESENCE_CLUSTER_NODES)
    client = _sync_clients.get((url, nodes))
    if client is None:
        if nodes:
            options = {**client_options(), **redis_clients.cluster_options(url)}
            client = redis_clients.cluster_sync_client(list(nodes), retry=Retry(NoBackoff(), 1), **options)
        else:
            client = redis_clients.sync_client(url, retry=Retry(NoBackoff(), 0), **client_options())
        _sync_clients[(url, nodes)] = client
    return client


def online_members() -> dict[str, list[str]] | None:
    """Every online user by environment id, from one pass over the presence keys; None on failure.

    A SCAN rather than an MGET of every user in the table: its cost follows the keyspace
    (what is online) instead of the user table, and it never blocks Redis like KEYS would (on a
    cluster, a SCAN of every master).
    """
    started = time.perf_counter()
    found: dict[str, list[str]] = {}
    try:
        # Only `presence:{b<n>}:{env uuid}:{user}` means online: markers, connection sets and the
        # deadline sets name their kind before the bucket's tag.
        for raw in sync_client().scan_iter(match="presence:{b*", count=1000):
            _, _, name = as_text(raw).partition("}:")
            environment_id, _, user_id = name.partition(":")
            if len(environment_id) == 36 and user_id and environment_id.count("-") == 4:
                found.setdefault(environment_id, []).append(user_id)
    except (redis.RedisError, RedisClusterException, OSError) as error:
        record_failure("online_members", error)
        return None
    finally:
        metrics.redis_op_seconds("online_members").observe(time.perf_counter() - started)
    return {environment_id: sorted(users) for environment_id, users in found.items()}


def online_flags(subjects: Sequence[tuple[str, str]], op: str = "online_flags") -> list[bool] | None:
    """Return, for each (environment id, user id), whether they are online now; None on failure.

    One round trip for the whole list (MGET; on a cluster, one per master), logged as
    `presence.failed` when Redis is down.
    """
    if not subjects:
        return []
    started = time.perf_counter()
    keys = [presence_key(env, user) for env, user in subjects]
    try:
        client = sync_client()
        values = client.mget_nonatomic(keys) if isinstance(client, RedisCluster) else client.mget(keys)
    except (redis.RedisError, RedisClusterException, OSError) as error:
        record_failure(op, error)
        return None
    finally:
        metrics.redis_op_seconds(op).observe(time.perf_counter() - started)
    return [value is not None for value in values]
