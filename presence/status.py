"""Rich presence: a user's status, idle, invisibility and devices (docs/contract.md, Rich presence).

What a user chose lives in the database (`presence.models.UserStatus`) and, for the hot path
(snapshots, channel presence, announcements), in a Redis hash beside it. A hash whose `s` field
is missing (a Redis restarted empty) is read again from the table and written back, so the
status survives anything Redis does.

Idle is per connection, kept in a second hash of the user's connections: `device|idle|connected
at|expires at` (Redis ms). A live connection's entry is refreshed by its instance every refresh
interval; a closed one's expires after the grace, so a reconnect inside it does not flip idle.
One script per change updates the entries and the user's aggregate (idle while every counted
connection is idle) and says whether the aggregate changed: only that caller announces it.

Announcements travel the presence fabric (presence/fabric.py): a `presence.status_change` to
the group of each of the user's channels (one frame per watcher, deduplicated like a transition)
and one, carrying `invisible`, for the user's own connections: to OWN_GROUP, which each process
joins once and hands to the user's connections it holds (a group per user would cost every
connection a SUBSCRIBE). The check that the user is online and the PUBLISHes are one script, so
a status never reaches a watcher ahead of the user's `online`, nor after their `offline` was
decided.
"""

import functools
import logging
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from limits import RateLimitItemPerSecond
from redis.commands.core import AsyncScript

from presence import actions
from presence.fabric import STATUS_CHANGE, State, group_name, transition_message
from presence.keys import user_tag
from presence.models import UserStatus
from presence.queries import channel_ids_of_member
from presence.reads import sync_client
from presence.scripts import ANNOUNCE, VISIBILITY, channels_key, presence_key
from presence.store import as_text, record_failure
from relay.clock import Periodic
from relay.frames import DeviceKind, PresenceSet, StatusOut, format_instant
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.loops import PerLoop, SharedOnce
from relay.models import Environment, User
from relay.rate_limits import ConnectionLimit
from webhooks import outbox

logger = logging.getLogger("presence")

DEVICES: tuple[str, ...] = DeviceKind.__args__
DEFAULT_DEVICE = "web"

# More than 10 presence.set and presence.activity frames in 10 s on one connection: `rate_limited`.
RATE = ConnectionLimit("presence", RateLimitItemPerSecond(10, 10))


def status_key(environment_id: str, user_id: str) -> str:
    """The hash caching the user's status: `s`, `t`, `e`, `u` (ISO or ""), `i` (invisible), `idle`."""
    return f"presence:status:{user_tag(environment_id, user_id)}:{environment_id}:{user_id}"


def devices_key(environment_id: str, user_id: str) -> str:
    """The hash of the user's connections: id -> `device|idle|connected at ms|expires at ms`."""
    return f"presence:devices:{user_tag(environment_id, user_id)}:{environment_id}:{user_id}"


# Every user's own status, for their connections (with `invisible`): joined once per process.
# Not under presence's GROUP_PREFIX, whose groups the fan-out claims.
OWN_GROUP = "status.own"


# KEYS: devices, status. ARGV: op, ms an entry counts from now, then per op: put: (connection id,
# `device|idle|connected at ms`) pairs, written as they are (the instance holding a connection
# knows its state, so an entry lost with Redis's data comes back at the next refresh); close:
# one connection id, whose entry then counts for the given time only; sweep: nothing. Drops
# expired entries, writes the user's idle (`idle` in the status hash) and returns {changed, idle}.
DEVICES_SCRIPT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local op = ARGV[1]
local expires = now + tonumber(ARGV[2])
local function parse(value)
  return string.match(value, '^(%a+)|(%d)|(%d+)|(%d+)$')
end
if op == 'put' then
  for i = 3, #ARGV, 2 do
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. '|' .. expires)
  end
elseif op == 'close' then
  local value = redis.call('HGET', KEYS[1], ARGV[3])
  if value then
    local device, idle, connected = parse(value)
    redis.call('HSET', KEYS[1], ARGV[3], device .. '|' .. idle .. '|' .. connected .. '|' .. expires)
  end
end
local entries = redis.call('HGETALL', KEYS[1])
local count, idle_count = 0, 0
for i = 1, #entries, 2 do
  local _, idle, _, ends = parse(entries[i + 1])
  if not ends or tonumber(ends) < now then
    redis.call('HDEL', KEYS[1], entries[i])
  else
    count = count + 1
    if idle == '1' then idle_count = idle_count + 1 end
  end
end
local idle = '0'
if count > 0 and idle_count == count then idle = '1' end
local before = redis.call('HGET', KEYS[2], 'idle') or '0'
redis.call('HSET', KEYS[2], 'idle', idle)
local changed = 0
if before ~= idle then changed = 1 end
return {changed, tonumber(idle)}
"""


# ── the status ────────────────────────────────────────────────────────────────
@dataclass(frozen=True)
class Status:
    """A user's chosen status, as stored; `effective` applies an expiry that passed."""

    status: str = "available"
    text: str = ""
    emoji: str = ""
    until: datetime | None = None
    invisible: bool = False
    last_seen_at: datetime | None = None

    @classmethod
    def of(cls, row: UserStatus | None) -> "Status":
        if row is None:
            return cls()
        return cls(row.status, row.text, row.emoji, row.until, row.invisible, row.last_seen_at)

    def effective(self, now: datetime | None = None) -> "Status":
        """The status as it stands at `now`: back to available once `until` has passed."""
        if self.until is not None and self.until <= (now or timezone.now()):
            return replace(self, status="available", text="", emoji="", until=None)
        return self

    def chosen(self) -> tuple:
        """The four fields a user chooses (watchers see them with idle)."""
        return (self.status, self.text, self.emoji, self.until)

    @property
    def is_default(self) -> bool:
        return self.chosen() == Status().chosen()

    def out(self, idle: bool) -> StatusOut:
        return StatusOut(
            status=self.status, text=self.text, emoji=self.emoji, until=format_instant(self.until), idle=idle
        )

    def cache_fields(self) -> dict[str, str]:
        return {
            "s": self.status,
            "t": self.text,
            "e": self.emoji,
            "u": "" if self.until is None else self.until.isoformat(),
            "i": "1" if self.invisible else "0",
        }

    @classmethod
    def from_cache(cls, values: Sequence[bytes | None]) -> "Status | None":
        """The cached status (READ_SCRIPT's fields of one key), or None when the hash holds none
        (never written, or Redis lost it)."""
        if values[0] is None:
            return None
        status, text, emoji, until, invisible = (_text(value or b"") for value in values[:5])
        return cls(status, text, emoji, datetime.fromisoformat(until) if until else None, invisible == "1")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


DEFAULT = Status()


class Forbidden(Exception):
    """Invisibility asked of an environment that does not allow it."""


@dataclass(frozen=True)
class Change:
    """One set's outcome: the status before and after, and the user's channels."""

    before: Status
    after: Status
    channels: list[str]


def write_status(
    environment_id: str, user: User, payload: PresenceSet, channels: Iterable[str] | None = None
) -> Change:
    """Apply a `presence.set` (or PUT body) to the user's row, in one transaction; raise Forbidden.

    `channels`: the user's channel ids when the caller knows them (a connection does), else read.
    """
    now = timezone.now()
    given = payload.model_fields_set
    with transaction.atomic():
        if payload.invisible and not Environment.objects.filter(pk=environment_id, allow_invisible=True).exists():
            raise Forbidden
        row, _ = UserStatus.objects.select_for_update().get_or_create(user=user)
        before = Status.of(row).effective(now)
        row.status, row.text, row.emoji, row.until = before.status, before.text, before.emoji, before.until
        for name in ("status", "text", "emoji", "invisible"):
            if name in given:
                setattr(row, name, getattr(payload, name))
        if "until" in given:
            row.until = None if payload.until is None else datetime.fromisoformat(payload.until)
        if row.invisible and not before.invisible:
            # Others saw the user leave now: this is the "last seen" they may be told.
            row.last_seen_at = now
        row.save()
    if channels is None:
        channels = channel_ids_of_member(environment_id, user.external_id)
    return Change(before=before, after=Status.of(row), channels=sorted(channels))


write_status_async = database_sync_to_async(write_status, thread_sensitive=False)


def read_statuses(environment_id: str, user_ids: Sequence[str]) -> dict[str, Status]:
    """The stored statuses of the environment's `user_ids` (users without a row are left out)."""
    rows = UserStatus.objects.filter(user__environment_id=environment_id, user__external_id__in=list(user_ids))
    return {
        row_user: Status.of(row)
        for row, row_user in ((row, row.user.external_id) for row in rows.select_related("user"))
    }


read_statuses_async = database_sync_to_async(read_statuses, thread_sensitive=False)


# ── reading the cache ────────────────────────────────────────────────────────
async def cached_statuses(
    environment_id: str, user_ids: Sequence[str], known: Mapping[str, Status] | None = None
) -> dict[str, tuple[Status, bool]]:
    """(status, idle) of each of `user_ids`: from Redis, the misses from `known` (statuses just
    read from the table) or else from the table, written back."""
    if not user_ids:
        return {}
    replies = await actions.service().store.call("status_read", lambda: _read_cache(environment_id, user_ids))
    found: dict[str, tuple[Status, bool]] = {}
    missing: list[str] = []
    idle_of: dict[str, bool] = {}
    for index, user_id in enumerate(user_ids):
        values = replies[index] if replies is not None else _NOTHING_CACHED
        if isinstance(values, int):
            found[user_id] = (DEFAULT, values == 1)
            continue
        idle_of[user_id] = values[5] in (b"1", "1")
        status = Status.from_cache(values)
        if status is None:
            missing.append(user_id)
        else:
            found[user_id] = (status.effective(), idle_of[user_id])
    if missing:
        known = known or {}
        unknown = [user_id for user_id in missing if user_id not in known]
        stored = {**known, **(await read_statuses_async(environment_id, unknown) if unknown else {})}
        for user_id in missing:
            status = stored.get(user_id, Status())
            found[user_id] = (status.effective(), idle_of[user_id])
        if replies is not None:
            await _write_cache(environment_id, [(user_id, stored.get(user_id, Status())) for user_id in missing])
    return found


# Each key's status fields and idle (false where absent), for many users in one call: all keys of
# one slot on a Redis Cluster, any keys on one Redis. The default status is only its idle, 0 or
# 1: most users have it, and a snapshot's reply is read off the socket a chunk per turn of a
# busy loop.
READ_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('HMGET', key, 's', 't', 'e', 'u', 'i', 'idle')
  if v[1] == 'available' and v[2] == '' and v[3] == '' and v[4] == '' and v[5] == '0' then
    out[i] = v[6] == '1' and 1 or 0
  else
    out[i] = v
  end
end
return out
"""
_NOTHING_CACHED = (None,) * 6


async def _read_cache(environment_id: str, user_ids: Sequence[str]) -> list:
    """READ_SCRIPT's reply for each of `user_ids`, in order."""
    store = actions.service().store
    keys = [status_key(environment_id, user_id) for user_id in user_ids]
    return await store.read_each(store.script(READ_SCRIPT), keys)


# A connect's fill of the user's cached status, sent in the election's round trip ahead of it,
# so watchers' snapshots find it instead of each reading the table. Written only where the hash
# holds no status: one set meanwhile is newer than what the connect read, and stays.
FILL_SCRIPT = """
if redis.call('HEXISTS', KEYS[1], 's') == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return 0
"""


def fill(environment_id: str, user_id: str, status: Status) -> tuple[AsyncScript, list, list]:
    """The script call that caches `status` (just read from the table) unless a status is cached."""
    script = actions.service().store.script(FILL_SCRIPT)
    args = [part for pair in status.cache_fields().items() for part in pair]
    return script, [status_key(environment_id, user_id)], args


async def _write_cache(environment_id: str, statuses: Iterable[tuple[str, Status]]) -> None:
    store = actions.service().store

    async def work() -> None:
        pipe = store.client.pipeline(transaction=False)
        for user_id, status in statuses:
            pipe.hset(status_key(environment_id, user_id), mapping=status.cache_fields())
        await pipe.execute()

    await store.call("status_write", work)


async def _cache_and_idle(environment_id: str, user_id: str, status: Status) -> bool:
    """Write the user's status to the cache and read their idle, in one round trip."""
    store = actions.service().store
    key = status_key(environment_id, user_id)

    async def work() -> list:
        pipe = store.client.pipeline(transaction=False)
        pipe.hset(key, mapping=status.cache_fields())
        pipe.hget(key, "idle")
        return await pipe.execute()

    replies = await store.call("status_write", work)
    return replies is not None and replies[1] is not None and as_text(replies[1]) == "1"


# ── announcing ───────────────────────────────────────────────────────────────
def _status_message(
    user_id: str, status: Status, idle: bool, change: str, channel: str | None, copies: int
) -> dict[str, object]:
    message: dict[str, object] = {
        "type": STATUS_CHANGE,
        "user": user_id,
        "status": status.status,
        "text": status.text,
        "emoji": status.emoji,
        "until": format_instant(status.until) or "",
        "idle": idle,
        "invisible": status.invisible,
        "change": change,
        "copies": copies,
    }
    if channel is not None:
        message["channel"] = channel
    return message


def status_sends(
    environment_id: str, user_id: str, status: Status, idle: bool, channels: Sequence[str], *, watchers: bool = True
) -> list[tuple[str, dict]]:
    """A status change as group messages: one per channel (for watchers, unless invisible), one for the user."""
    change = str(uuid.uuid4())
    sends = []
    if watchers and not status.invisible:
        sends = [
            (group_name(channel), _status_message(user_id, status, idle, change, channel, len(channels)))
            for channel in channels
        ]
    own = _status_message(user_id, status, idle, change, None, 1)
    own["environment"] = environment_id
    sends.append((OWN_GROUP, own))
    return sends


def transition_sends(user_id: str, state: State, channels: Sequence[str]) -> list[tuple[str, dict]]:
    """An `online`/`offline` for everyone but the user's own connections (turning invisible or back)."""
    transition = str(uuid.uuid4())
    return [
        (
            group_name(channel),
            transition_message(user_id, state, transition, channel, copies=len(channels), skip=user_id),
        )
        for channel in channels
    ]


async def publish_if_online(
    environment_id: str, user_id: str, sends: list[tuple[str, dict]], hidden: bool | None = None
) -> bool | None:
    """PUBLISH `sends` if, and only if, the user is online now (one script); None when Redis failed.

    `hidden`: the sends change the user's visibility; what watchers were told is kept beside the
    user's deadline with them (presence/scripts.py, VISIBILITY), for the reaper.
    """
    if not sends:
        return True
    store = actions.service().store
    publications = channel_layer().publications(sends, store.url)
    if publications is None:
        # The groups live on another Redis: check, then send through the layer.
        online = await store.online(environment_id, [user_id])
        if not online:
            return None if online is None else False
        try:
            await channel_layer().group_send_many(sends)
        except Exception as error:
            record_failure("status_publish", error)
            return None
        if hidden is not None:
            await _mark_hidden(environment_id, user_id, hidden)
        return True
    args = [part for pair in publications for part in pair]
    keys = [presence_key(environment_id, user_id)]
    script = store.script(ANNOUNCE)
    if hidden is not None:
        script = store.script(VISIBILITY)
        keys.append(channels_key(environment_id, user_id))
        args.insert(0, "1" if hidden else "0")
    reply = await store.call("status_publish", lambda: store.run_script(script, keys, args))
    return None if reply is None else bool(reply)


async def _mark_hidden(environment_id: str, user_id: str, hidden: bool) -> None:
    """VISIBILITY's write without its publish (the groups live on another Redis)."""
    store = actions.service().store
    script = store.script(VISIBILITY)
    keys = [presence_key(environment_id, user_id), channels_key(environment_id, user_id)]
    await store.call("status_publish", lambda: store.run_script(script, keys, ["1" if hidden else "0"]))


async def announce_change(environment_id: str, user_id: str, change: Change, idle: bool) -> bool | None:
    """Tell watchers and the user's own connections what a set changed; whether the user was online."""
    before, after, channels = change.before, change.after, change.channels
    sends: list[tuple[str, dict]] = []
    if after.invisible and not before.invisible:
        sends += transition_sends(user_id, "offline", channels)
        sends += status_sends(environment_id, user_id, after, idle, channels, watchers=False)
    elif before.invisible and not after.invisible:
        sends += transition_sends(user_id, "online", channels)
        sends += status_sends(environment_id, user_id, after, idle, channels, watchers=not after.is_default)
    else:
        sends += status_sends(
            environment_id, user_id, after, idle, channels, watchers=before.chosen() != after.chosen()
        )
    visibility = after.invisible if before.invisible != after.invisible else None
    online = await publish_if_online(environment_id, user_id, sends, visibility)
    if visibility is not None:
        log_event(logger, Event.PRESENCE_VISIBILITY, user=user_id, invisible=after.invisible)
    return online


async def set_status(
    environment_id: str, user: User, payload: PresenceSet, channels: Iterable[str] | None = None
) -> tuple[Status, bool]:
    """Store a set, refresh the cache and announce it; raise Forbidden (nothing changed)."""
    change = await write_status_async(environment_id, user, payload, None if channels is None else list(channels))
    return await apply_change(environment_id, user.external_id, change)


async def apply_change(environment_id: str, user_id: str, change: Change) -> tuple[Status, bool]:
    """What follows a stored set: the cache, the channels' online sets, the announcement."""
    service = actions.service()
    held = service.held.get((environment_id, user_id))
    if held is not None:
        # A re-election after Redis lost the key announces `online` to whom the user is visible.
        held.invisible = change.after.invisible
    idle = await _cache_and_idle(environment_id, user_id, change.after)
    if change.after.invisible and not change.before.invisible:
        # Uncounted before the `offline` goes: an occupancy read after it finds them gone. The
        # other instances holding the user's connections do the same when they hear the status.
        await service.recount(environment_id, user_id, True, change.channels)
    online = await announce_change(environment_id, user_id, change, idle)
    if change.before.invisible and not change.after.invisible and online:
        await service.recount(environment_id, user_id, False, change.channels)
    return change.after, idle


async def announce_idle(environment_id: str, user_id: str, idle: bool) -> None:
    """The user's idle flipped: tell watchers (if visible) and their own connections."""
    status, _ = (await cached_statuses(environment_id, [user_id]))[user_id]
    channels = sorted(await actions.read_channel_ids(environment_id, user_id))
    await publish_if_online(environment_id, user_id, status_sends(environment_id, user_id, status, idle, channels))


# ── the connections' devices and idle ────────────────────────────────────────
async def devices_op(environment_id: str, user_id: str, op: str, ttl: int, *args: str) -> tuple[bool, bool] | None:
    """Run one devices op; (idle changed, idle now), or None when Redis failed."""
    store = actions.service().store
    script = store.script(DEVICES_SCRIPT)
    keys = [devices_key(environment_id, user_id), status_key(environment_id, user_id)]
    # Batched with the store's other scripts: a burst of connects and closes queued one pool
    # acquisition each, every one a turn of the loop, behind redis-py's pool lock.
    reply = await store.call("devices", lambda: store.run_script(script, keys, [op, ttl, *args]))
    if reply is None:
        return None
    return bool(reply[0]), bool(reply[1])


def live_ttl() -> int:
    """How long a live connection's entry counts without a refresh: the presence TTL, then the grace."""
    return settings.RELAY_PRESENCE_TTL_MS + settings.RELAY_PRESENCE_GRACE_MS


def read_devices(environment_id: str, user_id: str) -> list[dict] | None:
    """The user's counted connections, oldest first: `{"device", "idle", "connected_at"}` (sync)."""
    try:
        client = sync_client()
        now_seconds, now_micros = client.time()
        entries = client.hgetall(devices_key(environment_id, user_id))
    except Exception as error:
        record_failure("devices_read", error)
        return None
    now = now_seconds * 1000 + now_micros // 1000
    connections = []
    for value in entries.values():
        device, idle, connected, expires = _text(value).split("|")
        if int(expires) >= now:
            connections.append((int(connected), device, idle == "1"))
    return [
        {"device": device, "idle": idle, "connected_at": format_instant(_from_ms(connected))}
        for connected, device, idle in sorted(connections)
    ]


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


# Where a connection keeps its device, its idle flag and when it connected (Redis ms).
DEVICE_KEY = "presence.device"


# Slots: one of these lives on every connection.
@dataclass(slots=True)
class Device:
    kind: str
    idle: bool
    connected_ms: int


def entry(conn: object) -> tuple[str, str]:
    """The connection's (id, `device|idle|connected at ms`) for DEVICES_SCRIPT's `put`."""
    device: Device = conn.state[DEVICE_KEY]
    return conn.connection_id, f"{device.kind}|{int(device.idle)}|{device.connected_ms}"


class Devices:
    """This event loop's connections for rich presence: refresh of their entries, the expiry sweep,
    and the users' own statuses (OWN_GROUP) handed to their connections here."""

    def __init__(self) -> None:
        self.connections: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
        self.rounds = Periodic(
            self._round,
            interval=lambda: settings.RELAY_PRESENCE_REFRESH_MS / 1000,
            clock=lambda: actions.service().clock,
            failed=functools.partial(record_failure, "status_tick"),
            wanted=lambda: bool(self.connections) and not actions.service().closed,
        )
        # Joined once for this loop; later calls return at once.
        self.join = SharedOnce(lambda: channel_layer().route_group(OWN_GROUP, self.received))

    def received(self, message: dict) -> None:
        """A user's own status: put on the queue of each of their connections here (which validates it)."""
        subject = (message.get("environment"), message.get("user"))
        if not all(isinstance(part, str) for part in subject):
            return
        held = actions.service().held.get(subject)
        if held is None:
            return
        layer = channel_layer()
        for connection_id in list(held.connections):
            conn = self.connections.get(connection_id)
            if conn is not None:
                layer.send_local(conn.channel_name, message)

    def add(self, conn: object) -> None:
        self.connections[conn.connection_id] = conn
        self.rounds.start()

    def discard(self, conn: object) -> bool:
        """Forget `conn`; True when it was here (it had opened)."""
        return self.connections.pop(conn.connection_id, None) is not None

    async def _round(self) -> None:
        await self.refresh()
        await expire_due()

    async def refresh(self) -> None:
        """Keep every local connection's entry counting (one script per user)."""
        by_user: dict[tuple[str, str], list[str]] = {}
        for conn in list(self.connections.values()):
            by_user.setdefault((conn.environment_id, conn.user_id), []).extend(entry(conn))
        for (environment_id, user_id), pairs in by_user.items():
            changed = await devices_op(environment_id, user_id, "put", live_ttl(), *pairs)
            # Whoever's script sees the flip announces it: a closed connection's entry ends
            # without a script of its own if a refresh of the user's others gets there first.
            if changed is not None and changed[0]:
                await announce_idle(environment_id, user_id, changed[1])


# This event loop's connections (made on first use).
devices = PerLoop(Devices)


# ── expiry ───────────────────────────────────────────────────────────────────
def claim_expired(now: datetime) -> list[tuple[str, User, Status]]:
    """Reset every status whose `until` passed; each row is reset by one conditional update, so
    of several instances sweeping at once exactly one claims (and announces) each expiry."""
    claimed = []
    for row in UserStatus.objects.filter(until__lte=now).select_related("user")[:500]:
        with transaction.atomic():
            if not UserStatus.objects.filter(pk=row.pk, until=row.until).update(
                status="available", text="", emoji="", until=None
            ):
                continue
            row.status, row.text, row.emoji, row.until = "available", "", "", None
            # An UPDATE sends no post_save: the claim writes its webhook event in its own transaction.
            outbox.record_status(row)
        claimed.append((str(row.user.environment_id), row.user, Status.of(row)))
    return claimed


claim_expired_async = database_sync_to_async(claim_expired, thread_sensitive=False)


async def expire_due() -> None:
    """Reset and announce the statuses whose `until` passed (run every refresh interval)."""
    for environment_id, user, status in await claim_expired_async(timezone.now()):
        await _write_cache(environment_id, [(user.external_id, status)])
        idle = (await cached_statuses(environment_id, [user.external_id]))[user.external_id][1]
        channels = sorted(await actions.read_channel_ids(environment_id, user.external_id))
        sends = status_sends(environment_id, user.external_id, status, idle, channels)
        await publish_if_online(environment_id, user.external_id, sends)
        log_event(logger, Event.PRESENCE_STATUS_EXPIRED, user=user.external_id)
