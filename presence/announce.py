"""Announcing a user just added to a channel to the members who could not see them before.

The other half of a live membership change: the added user's own connections hear who of the
channel is online (`reads.announce_new_co_members`); here the channel's members hear the added
user, if they are online, so a client that applies the snapshot and every change keeps the true
state across the change. Run in the request that added the membership (`membership.member_added`).

Without a ghost: the check that the user is online and the PUBLISH are one script, so a grace
check's `offline` (also a script) either came first, and nothing is announced, or comes after,
and goes to this channel too, because the `offline` is sent to the channels of the decision
(the grace check reads them when it decides).
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence

import redis
from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from redis.exceptions import RedisClusterException

from presence import actions
from presence.fabric import group_name, transition_message
from presence.queries import is_invisible, large_channel_ids
from presence.reads import members_newly_seeing, sync_client
from presence.scripts import (
    ANNOUNCE,
    CHANNEL_LEFT,
    CHANNEL_SEEN,
    CHANNEL_UNSEEN,
    channel_online_key,
    channels_key,
    presence_key,
)
from presence.store import Timings, record_failure
from relay import metrics
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.models import Channel, Membership, User

logger = logging.getLogger("presence")


async def _publications(sends: list[tuple[str, dict]]) -> list[tuple[str, bytes]] | None:
    # In the event loop: the layer's serializer and shards belong to the loop's own layer.
    return channel_layer().publications(sends, settings.RELAY_PRESENCE_REDIS_URL)


def member_added(
    sender: type, channel: Channel, user: User, membership_id: int | None = None, **kwargs: object
) -> None:
    """`membership.member_added` receiver: put the user in the channel's online set if online,
    and announce their `online` to those it is news to."""
    channel_id = str(channel.id)
    if is_invisible(str(channel.environment_id), user.external_id):
        return  # they look offline to the channel's members
    join_online_set(str(channel.environment_id), user.external_id, channel_id)
    if large_channel_ids([channel_id]):
        # Counted, not named: the instances' next recheck sends the channel's new count.
        return
    # Those who shared no other channel with the user: the others already hear their transitions.
    watchers = members_newly_seeing(str(channel.environment_id), user, channel_id, membership_id)
    if not watchers:
        return
    environment_id = str(channel.environment_id)
    transition_id = announcement_id(environment_id, membership_id)
    # No `copies`: the user's holders may send it too (`announce_held`), so watchers deduplicate it.
    message = transition_message(user.external_id, "online", transition_id, channel_id, audience=watchers)
    publish = async_to_sync(_publications)([(group_name(channel_id), message)])
    if publish is None:
        # The groups live on another Redis than presence (RELAY_PRESENCE_REDIS_URL): the check
        # and the publish cannot be one script, and announcing after a separate check could follow the
        # user's `offline` and leave a ghost. They hear the user's next transition.
        return
    read_at = time.monotonic()
    announced = announce(environment_id, user.external_id, publish)
    if announced:
        # A count: the ids would be a membership graph in a log file.
        log_event(logger, Event.PRESENCE_ANNOUNCED, user=user.external_id, watchers=len(watchers))
    elif announced is False:
        # Redis may have lost the user's key moments ago: they may be online all the same, their
        # holder not having re-elected them yet (in silence). Asked again once it has.
        async_to_sync(_announce_if_settling)(environment_id, user.external_id, publish, len(watchers), read_at)
    else:
        # Redis did not answer: no later transition would tell these members, whose view of the
        # user starts now, so it is asked again until Redis answers.
        async_to_sync(_announce_when_redis_answers)(environment_id, user.external_id, publish, len(watchers))


# The namespace of announcement ids (`announcement_id`).
ANNOUNCEMENTS = uuid.uuid5(uuid.NAMESPACE_URL, "relay:presence.announced")


def announcement_id(environment_id: str, membership_id: int | None) -> str:
    """The transition id of a membership's announcement: the same wherever it is made.

    The request that added the membership announces it, and so do the instances holding the
    user's connections (`announce_held`); a watcher that heard one drops the others as copies.
    A row moved to this pair (no id of its own) gets a fresh one.
    """
    if membership_id is None:
        return str(uuid.uuid4())
    return str(uuid.uuid5(ANNOUNCEMENTS, f"{environment_id}:{membership_id}"))


def _held_announcement(environment_id: str, user_id: str, channel_id: str) -> tuple[str, list[str]] | None:
    """The announcement's id and audience for the user's membership of the channel; None when it has none."""
    membership = (
        Membership.objects.filter(channel_id=channel_id, user__external_id=user_id, user__environment_id=environment_id)
        .select_related("user")
        .first()
    )
    if membership is None or is_invisible(environment_id, user_id) or large_channel_ids([channel_id]):
        return None
    watchers = members_newly_seeing(environment_id, membership.user, channel_id, membership.pk)
    return (announcement_id(environment_id, membership.pk), watchers) if watchers else None


async def announce_held(environment_id: str, user_id: str, channel_id: str) -> None:
    """Announce a user added to a channel from an instance holding their connection, as the request did.

    The request's announcement can find the user offline: between a close's grace and a connect
    whose channels were read before the change, or with their key not re-elected yet after Redis
    lost its data, when the later attempt it arms lives in its own process, which can die first.
    A holder applies the change once the user is elected there, knows when it has re-elected them,
    and lives as long as the connection: it announces as it applies the change, and once Redis
    has settled if it lost its data around then (presence/extension.py). Logged with `holder`:
    usually a copy of the request's, which watchers drop.
    """
    found = await database_sync_to_async(_held_announcement)(environment_id, user_id, channel_id)
    if found is None:
        return
    transition_id, watchers = found
    message = transition_message(user_id, "online", transition_id, channel_id, audience=watchers)
    publish = await _publications([(group_name(channel_id), message)])
    if publish is None:
        return  # a separate presence Redis: as in `member_added`
    announced = await sync_to_async(announce, thread_sensitive=False)(environment_id, user_id, publish)
    if announced:
        log_event(logger, Event.PRESENCE_ANNOUNCED, user=user_id, watchers=len(watchers), holder=True)
    elif announced is None:
        # Redis did not answer (the settled attempt can meet a second fault): asked again, as
        # the request's is, until it answers.
        await _announce_when_redis_answers(environment_id, user_id, publish, len(watchers))


# Announcements waiting for a re-election or for Redis to answer, on the process's event loop
# (bounded: an API client adding members in bulk during an outage queues no more than this).
_later: set[asyncio.Task] = set()
MAX_LATER = 10_000
# Announcements that found the user offline, waiting to learn whether Redis had just lost their
# key (as many at most).
_rechecks = 0
# How long an announcement Redis did not answer is asked again (an outage longer than this is
# an operator's to see in `presence.failed`).
RETRY_SECONDS = 300


async def _announce_if_settling(
    environment_id: str, user_id: str, publish: Sequence[tuple[str, bytes]], watchers: int, read_at: float
) -> None:
    # Only an instance that found its users' keys gone knows Redis lost data (a young epoch alone
    # is no sign); announced again otherwise, the user's own `online` could be heard twice.
    global _rechecks
    service = actions.service.existing()  # none: this process holds no connection to know by
    if service is None:
        return
    if delay := service.unsettled_for():
        if len(_later) < MAX_LATER:
            _keep(asyncio.ensure_future(_announce_after(delay, environment_id, user_id, publish, watchers)))
    elif _rechecks < MAX_LATER:
        # Read maybe between Redis losing its data and this instance's refresh finding out (within
        # `Timings.rejoin` and an interval): asked again if the refresh then does.
        _rechecks += 1
        again = (service.timings.rejoin + service.timings.refresh) / 1000
        args = (service, read_at, environment_id, user_id, publish, watchers)
        asyncio.get_running_loop().call_later(again, _announce_if_lost, *args)


def _announce_if_lost(
    service: actions.PresenceService,
    read_at: float,
    environment_id: str,
    user_id: str,
    publish: Sequence[tuple[str, bytes]],
    watchers: int,
) -> None:
    global _rechecks
    _rechecks -= 1
    if service.lost_before(read_at) and len(_later) < MAX_LATER:
        delay = service.unsettled_for()
        _keep(asyncio.ensure_future(_announce_after(delay, environment_id, user_id, publish, watchers)))


def _keep(task: asyncio.Task) -> None:
    _later.add(task)
    task.add_done_callback(_later.discard)


async def _announce_when_redis_answers(
    environment_id: str, user_id: str, publish: Sequence[tuple[str, bytes]], watchers: int
) -> None:
    if len(_later) < MAX_LATER:
        _keep(asyncio.ensure_future(_announce_again(environment_id, user_id, publish, watchers)))


async def _announce_again(
    environment_id: str, user_id: str, publish: Sequence[tuple[str, bytes]], watchers: int
) -> None:
    """Ask every refresh interval, for up to `RETRY_SECONDS`, until Redis answers.

    The same payload each time, so the same transition id: a watcher that got an earlier attempt
    whose reply was lost drops this one as a copy.
    """
    interval = Timings.from_settings().refresh / 1000
    deadline = time.monotonic() + RETRY_SECONDS
    while time.monotonic() < deadline:
        await asyncio.sleep(interval)
        read_at = time.monotonic()
        announced = await sync_to_async(announce, thread_sensitive=False)(environment_id, user_id, publish)
        if announced:
            log_event(logger, Event.PRESENCE_ANNOUNCED, user=user_id, watchers=watchers)
        elif announced is False:
            await _announce_if_settling(environment_id, user_id, publish, watchers, read_at)
        if announced is not None:
            return


async def _announce_after(
    delay: float, environment_id: str, user_id: str, publish: Sequence[tuple[str, bytes]], watchers: int
) -> None:
    await asyncio.sleep(delay)
    read_at = time.monotonic()
    announced = await sync_to_async(announce, thread_sensitive=False)(environment_id, user_id, publish)
    if announced:
        log_event(logger, Event.PRESENCE_ANNOUNCED, user=user_id, watchers=watchers)
    elif announced is False:
        # Redis may have lost the key again since it settled.
        await _announce_if_settling(environment_id, user_id, publish, watchers, read_at)
    else:
        await _announce_when_redis_answers(environment_id, user_id, publish, watchers)


def member_removed(sender: type, channel_id: str, user_pk: int, **kwargs: object) -> None:
    """`membership.member_removed` receiver: the channel leaves what the reaper would tell, and its online set.

    Both are the holders' to write as they apply the removal too, but a holder that dies before
    then would leave the reaper publishing the user's `offline` to a channel whose members no
    longer share it with them, and the channel counting them online.
    """
    found = User.objects.filter(pk=user_pk).values_list("environment_id", "external_id").first()
    if found is None:
        return
    environment_id, user_id = str(found[0]), found[1]
    started = time.perf_counter()
    try:
        client = sync_client()
        client.register_script(CHANNEL_LEFT)(keys=[channels_key(environment_id, user_id)], args=[channel_id])
        client.zrem(channel_online_key(channel_id), user_id)
    except (redis.RedisError, OSError) as error:
        record_failure("channel_left", error)
    finally:
        metrics.redis_op_seconds("channel_left").observe(time.perf_counter() - started)


def join_online_set(environment_id: str, user_id: str, channel_id: str) -> None:
    """Put the user in the channel's online set if they are online, before the API answers.

    A snapshot read after the answer must list them (docs/contract.md: every user sharing a
    channel who is online now); the instances holding their connections write it too, but only
    once the change's notice reaches them, and a watcher can connect before that. Written
    first and checked after: an `offline` decided after the check takes the user out of the
    channels it reads from the database, this one among them, so no ghost is left; when the
    check finds them offline the write is undone (unless a connect renewed it meanwhile).
    """
    key = channel_online_key(channel_id)
    started = time.perf_counter()
    try:
        client = sync_client()
        score = client.register_script(CHANNEL_SEEN)(
            keys=[key], args=[Timings.from_settings().seen_for, "score", user_id]
        )
        if not client.exists(presence_key(environment_id, user_id)):
            # Only this write's entry: one a connect renewed meanwhile scores higher and stays.
            client.register_script(CHANNEL_UNSEEN)(keys=[key], args=[float(score) + 1, user_id])
    except (redis.RedisError, RedisClusterException, OSError) as error:
        # The holders' own write (as they apply the change) and their refresh still add them.
        record_failure("channel_joined", error)
    finally:
        metrics.redis_op_seconds("channel_joined").observe(time.perf_counter() - started)


def announce(environment_id: str, user_id: str, publish: Sequence[tuple[str, bytes]]) -> bool | None:
    """PUBLISH each (channel, payload) of `publish` if, and only if, the user is online now.

    Returns whether they were; None when Redis did not answer (logged as `presence.failed`).
    """
    started = time.perf_counter()
    try:
        script = sync_client().register_script(ANNOUNCE)
        return bool(script(keys=[presence_key(environment_id, user_id)], args=[p for pair in publish for p in pair]))
    except (redis.RedisError, RedisClusterException, OSError) as error:
        record_failure("announce", error)
        return None
    finally:
        metrics.redis_op_seconds("announce").observe(time.perf_counter() - started)
