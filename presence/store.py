"""The presence store: Redis keys, the Lua scripts that change them, and fail-fast clients.

Keys, all scoped by environment so the same user id in two tenants is two people:

- `presence:{env}:{user}`          the presence key: exists while the user is online (the election)
- `presence:offline:{env}:{user}`  the offline marker: elects one publisher of `offline`
- `presence:conns:{env}:{user}`    sorted set of live connection ids (score = expiry, Redis ms)
- `presence:deadlines`             sorted set of `{env}:{user}` (score = when a silent holder is
                                   presumed dead: last refresh + TTL + grace), reaped by every instance
- `presence:channels:{env}:{user}` hash beside the deadline: `c` the user's channel ids (comma-
                                   separated) as their holders last wrote them, `e` the epoch then;
                                   what the reaper's `offline` needs, with no database read
- `presence:epoch`                 a random id written by the first instance that finds it missing:
                                   a different or missing epoch means Redis lost its data meanwhile

The scripts derive the per-user key names from the `{env}:{user}` member (the environment is a
36-character UUID, so the first colon after it is unambiguous). They touch keys not declared in
KEYS, which a single Redis allows and Redis Cluster would not; presence runs on one Redis.

Nothing here is a source of truth: presence is ephemeral, and a flushed Redis self-heals through
the refresh. Every call FAILS FAST (short timeouts, no retries; a connect's or close's script waits
at most for the one pipeline ahead of it) and a failure is logged once per call as
`presence.failed {op, error}` and answered with None, so presence degrades alone.
"""

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import redis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError
from redis.retry import Retry

from relay import metrics, redis_clients
from relay.batching import GroupCommit
from relay.logging import log_event
from relay.transport.hiredis import pack_with_hiredis

logger = logging.getLogger("presence")

T = TypeVar("T")

DEADLINES = "presence:deadlines"
# Long enough to fail over to a dead peer, short enough that a dead store is noticed on the
# call that hit it rather than after a queue of them (docs/presence.md, Failure behaviour).
TIMEOUT_SECONDS = 0.5
# How many due deadlines one REAP script takes: a pass runs scripts until fewer are due, and
# one script of this size holds Redis for a few milliseconds.
REAP_BATCH = 1000
MAX_ERROR_LENGTH = 200


def member(environment_id: str, user_id: str) -> str:
    """The `{env}:{user}` name of one tenant's user, the suffix of all their keys."""
    return f"{environment_id}:{user_id}"


def split_member(name: str) -> tuple[str, str]:
    """Return (environment id, user id) of a `{env}:{user}` member."""
    environment_id, _, user_id = name.partition(":")
    return environment_id, user_id


def presence_key(environment_id: str, user_id: str) -> str:
    """The key whose existence means "online"."""
    return f"presence:{member(environment_id, user_id)}"


def marker_key(environment_id: str, user_id: str) -> str:
    """The marker whose `SET NX` elects the one publisher of `offline`."""
    return f"presence:offline:{member(environment_id, user_id)}"


def connections_key(environment_id: str, user_id: str) -> str:
    """The sorted set of the user's live connections on every instance."""
    return f"presence:conns:{member(environment_id, user_id)}"


def channels_key(environment_id: str, user_id: str) -> str:
    """The hash beside the deadline: the user's channel ids (`c`) and the epoch they were written in (`e`)."""
    return f"presence:channels:{member(environment_id, user_id)}"


def fresh_epoch() -> str:
    """A new epoch id, written by the script that finds none."""
    return uuid.uuid4().hex


# Redis time in ms: every instance measures deadlines on the one clock they share.
_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

EPOCH = "presence:epoch"

# The epoch of the data Redis holds: written (from the caller's fresh id) when missing, so the
# first script to find Redis emptied starts a new one. `epoch_key` and `fresh` are Lua expressions.
_EPOCH = """
local epoch = redis.call('GET', {epoch_key})
if not epoch then
  epoch = {fresh}
  redis.call('SET', {epoch_key}, epoch)
end
"""

# KEYS: conns, key, marker, deadlines, channels, epoch. ARGV: connection id, ttl, grace, max,
# member, environment id, fresh epoch, the user's channel ids (comma-separated), n, then n
# (channel, payload) pairs to PUBLISH if this connection wins, then the user ids whose presence
# the connection's snapshot needs. The limit, the election, the winner's `online` and the
# snapshot's read in one round trip. Returns {admitted, won, online user id, ...}; won is 0 (the
# user was online already), 1 (this connection publishes `online`) or 2 (the key was gone but the
# user's last `online` was never retracted: nothing to publish).
ADMIT = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[6]", fresh="ARGV[7]")
    + """
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return {0, 0}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
local won = 0
if redis.call('SET', KEYS[2], '1', 'PX', ttl, 'NX') then
  if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('ZSCORE', KEYS[4], ARGV[5]) then
    -- The key is gone, yet nobody said the user left and their deadline stands: the instance
    -- that held them died (or a close's re-pin came too late), and the `online` watchers last
    -- heard was never retracted. A second one would say nothing new; the deadline is taken
    -- over below, so the reaper stays quiet too.
    won = 2
  else
    won = 1
    -- The winner clears "somebody already said they left" so the next departure elects again.
    redis.call('DEL', KEYS[3])
    for i = 10, 9 + 2 * tonumber(ARGV[9]), 2 do
      redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
    end
  end
else
  -- A key a close re-pinned to the grace has a live connection again: back to the TTL,
  -- which this connection's instance now refreshes.
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('ZADD', KEYS[4], now + ttl + tonumber(ARGV[3]), ARGV[5])
redis.call('HSET', KEYS[5], 'c', ARGV[8], 'e', epoch)
local reply = {1, won}
local prefix = 'presence:' .. ARGV[6] .. ':'
for i = 10 + 2 * tonumber(ARGV[9]), #ARGV do
  if redis.call('EXISTS', prefix .. ARGV[i]) == 1 then
    table.insert(reply, ARGV[i])
  end
end
return reply
"""
)

# KEYS: conns, key, epoch. ARGV: connection id, grace, "1" when it was the user's last local
# connection, fresh epoch. Frees the slot; on the last local close re-pins the key to the grace
# (docs/presence.md, The races: the re-pin): without it the key dies at last refresh + TTL, possibly before the grace
# ends, and a reconnect in that gap wins the election and publishes a second `online` for a user
# who never left. Returns the epoch, which the grace check compares with its own.
RELEASE = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[3]", fresh="ARGV[4]")
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[3] ~= '1' then
  return epoch
end
local grace = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) == 0 then
  -- XX: a key that already expired stays gone.
  redis.call('SET', KEYS[2], '1', 'PX', grace, 'XX')
  return epoch
end
-- Another instance still holds a connection and refreshes the key: extend, never shorten,
-- so a short grace cannot expire the key between two of its refreshes.
if redis.call('PTTL', KEYS[2]) < grace then
  redis.call('PEXPIRE', KEYS[2], grace)
end
return epoch
"""
)

# KEYS: key, marker, deadlines, channels, epoch. ARGV: marker ttl, member, the epoch the close
# saw, fresh epoch, then (channel, payload) pairs to PUBLISH if this caller wins.
# Returns {0} = still online, {1} = won the right to publish `offline`, {2} = another instance
# (or the reaper) already did, {3, epoch} = Redis lost its data since the close (the epoch
# differs): decide nothing now, since the live holders re-elect the key at their next refresh.
# The winner takes the user's deadline: a deadline only stands while the last word said of the
# user is `online` (ADMIT relies on it).
GRACE_CHECK = (
    _EPOCH.format(epoch_key="KEYS[5]", fresh="ARGV[4]")
    + """
if epoch ~= ARGV[3] then
  return {3, epoch}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
if redis.call('SET', KEYS[2], '1', 'PX', ARGV[1], 'NX') then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('DEL', KEYS[4])
  for i = 5, #ARGV, 2 do
    redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
  end
  return {1}
end
return {2}
"""
)

# KEYS: key. ARGV: (channel, payload) pairs to PUBLISH if the user is online. The check and the
# publish in one script: an `offline` decided by a grace check (also a script) falls wholly
# before it, and then nothing is announced, or wholly after it, and then follows it.
ANNOUNCE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV, 2 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
end
return 1
"""

# KEYS: deadlines, epoch. ARGV: ttl, grace, fresh epoch, then per held user: member, "=" and the
# user's channel ids (comma-separated) when they changed since this instance last wrote them or
# "" when not, n, n connection ids. One round trip per instance per interval. Returns
# {{member, had_marker, ...}, {member, ...}}: the keys found missing under a live connection
# (a Redis restart or eviction), which are re-elected, and the users whose channels are missing
# from Redis (the caller sends them next time).
REFRESH = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[2]", fresh="ARGV[3]")
    + """
local ttl = tonumber(ARGV[1])
local grace = tonumber(ARGV[2])
local vanished = {}
local unwritten = {}
local i = 4
while i <= #ARGV do
  local name = ARGV[i]
  local count = tonumber(ARGV[i + 2])
  local key = 'presence:' .. name
  if not redis.call('SET', key, '1', 'PX', ttl, 'XX') then
    redis.call('SET', key, '1', 'PX', ttl)
    -- Unconditionally: a stale "offline was said" must not stand against a connected user.
    local had_marker = redis.call('DEL', 'presence:offline:' .. name)
    table.insert(vanished, name)
    table.insert(vanished, had_marker)
  end
  local conns = 'presence:conns:' .. name
  for j = 1, count do
    redis.call('ZADD', conns, now + ttl, ARGV[i + 2 + j])
  end
  redis.call('PEXPIRE', conns, ttl)
  redis.call('ZADD', KEYS[1], now + ttl + grace, name)
  local channels = 'presence:channels:' .. name
  if ARGV[i + 1] ~= '' then
    redis.call('HSET', channels, 'c', string.sub(ARGV[i + 1], 2), 'e', epoch)
  elseif redis.call('EXISTS', channels) == 0 then
    table.insert(unwritten, name)
  end
  i = i + 3 + count
end
return {vanished, unwritten}
"""
)

# KEYS: deadlines, epoch. ARGV: marker ttl, grace, batch, refresh, fresh epoch, a uuid4 the
# transition ids are made from, the Redis channel prefix of the presence groups ("" when the
# groups live on another Redis). Takes due deadlines (their holder stopped refreshing: a dead
# instance) and elects one publisher of `offline` per user through the same marker as the grace
# check, so a reaper and a grace check never both publish; with a prefix, the winner's `offline`
# is PUBLISHed here, to the channels kept beside the deadline, so no `online` of a reconnect can
# fall between the decision and the publish. A deadline written in another epoch than Redis's
# waits one refresh interval (the live holders re-elect first). The message is the channel
# layer's own encoding (msgpack) of `presence.fabric.transition_message`.
# Returns {due, member, won, channel ids (comma-separated), ...}.
REAP = (
    _NOW
    + _EPOCH.format(epoch_key="KEYS[2]", fresh="ARGV[5]")
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local prefix = ARGV[7]
local base = string.sub(ARGV[6], 1, 28)
local made = 0
local decided = {#due}
for _, name in ipairs(due) do
  local pttl = redis.call('PTTL', 'presence:' .. name)
  local info = 'presence:channels:' .. name
  local written = redis.call('HGET', info, 'e')
  if pttl ~= -2 then
    -- Still held (or pinned by a close): look again once it could have expired.
    redis.call('ZADD', KEYS[1], now + math.max(pttl, 0) + tonumber(ARGV[2]), name)
  elseif written and written ~= epoch then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), name)
    redis.call('HSET', info, 'e', epoch)
  else
    local csv = redis.call('HGET', info, 'c') or ''
    redis.call('ZREM', KEYS[1], name)
    redis.call('DEL', info)
    local won = 0
    if redis.call('SET', 'presence:offline:' .. name, '1', 'PX', ARGV[1], 'NX') then
      won = 1
      if prefix ~= '' then
        local channels = {}
        for channel in string.gmatch(csv, '[^,]+') do
          table.insert(channels, channel)
        end
        made = made + 1
        local transition = base .. string.format('%08x', made)
        local user = string.sub(name, 38)
        for _, channel in ipairs(channels) do
          redis.call('PUBLISH', prefix .. channel, cmsgpack.pack({
            type = 'presence.transition', user = user, state = 'offline', transition = transition,
            channel = channel, copies = #channels}))
        end
      end
    end
    table.insert(decided, name)
    table.insert(decided, won)
    table.insert(decided, csv)
  end
end
return decided
"""
)


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


def record_failure(op: str, error: BaseException) -> None:
    """Log `presence.failed {op, error}` once for one failed operation, without a traceback."""
    metrics.PRESENCE_FAILURES.labels(op=op).inc()
    log_event(logger, "presence.failed", logging.ERROR, op=op, error=_short(error))


@dataclass(frozen=True)
class Election:
    """The outcome of one connection's election: let in, won, and who of those asked is online."""

    admitted: bool
    won: bool
    online: list[str]
    # The key was gone but the user's last `online` was never retracted (their instance died):
    # this connection took the key over and has nothing to publish.
    unretracted: bool = False


@dataclass(frozen=True)
class Reaped:
    """One REAP script's answer: how many deadlines were due, and the users it decided."""

    due: int
    # (member, won the offline election, the channel ids kept beside the deadline)
    decided: list[tuple[str, bool, list[str]]]


@dataclass(frozen=True)
class Timings:
    """The presence timings in milliseconds, read from settings once per store."""

    grace: int
    ttl: int
    refresh: int
    margin: int
    max_connections: int

    @classmethod
    def from_settings(cls) -> "Timings":
        return cls(
            grace=settings.RELAY_PRESENCE_GRACE_MS,
            ttl=settings.RELAY_PRESENCE_TTL_MS,
            refresh=settings.RELAY_PRESENCE_REFRESH_MS,
            margin=settings.RELAY_PRESENCE_MARGIN_MS,
            max_connections=settings.RELAY_MAX_CONNECTIONS_PER_USER,
        )

    @property
    def check_delay(self) -> int:
        """When the grace check runs after a close: grace + margin (docs/presence.md, The races: the margin)."""
        return self.grace + self.margin

    @property
    def marker_ttl(self) -> int:
        """How long an offline marker lives.

        Longer than any deadline a close leaves behind (last refresh + TTL + grace, reaped up to
        one refresh later), so the reaper finds the marker of a normal close and stays quiet
        instead of publishing a second `offline`. A longer life is harmless: a marker only ever
        stands while the last published state is `offline`, and the next `online` deletes it.
        """
        return self.ttl + self.grace + self.margin + 2 * self.refresh


def _client_options() -> dict:
    return {
        "socket_connect_timeout": TIMEOUT_SECONDS,
        "socket_timeout": TIMEOUT_SECONDS,
        "health_check_interval": 0,
    }


class PresenceStore:
    """The async presence client of one event loop, with its scripts and fail-fast wrapper."""

    def __init__(self, url: str, timings: Timings) -> None:
        self.url = url
        self.timings = timings
        # retries=0: redis-py retries three times with backoff by default, which turns a dead
        # store into a stall on every call instead of one quick, logged failure.
        self.client = redis_clients.async_client(url, retry=AsyncRetry(NoBackoff(), 0), **_client_options())
        pack_with_hiredis(self.client.connection_pool)
        self._admit = self.client.register_script(ADMIT)
        self._release = self.client.register_script(RELEASE)
        self._grace_check = self.client.register_script(GRACE_CHECK)
        self._refresh = self.client.register_script(REFRESH)
        self._reap = self.client.register_script(REAP)
        # A connect's or close's script goes with the calls made while one round trip is in flight
        # (relay.batching). One call each would put hundreds in flight in a burst, each queued
        # behind the others' set-up on redis-py's pool lock. A call alone goes at once.
        self._scripts: GroupCommit[tuple[AsyncScript, list, list], object] = GroupCommit(self._send_scripts)

    async def _script(self, script: AsyncScript, keys: list, args: list) -> object:
        return await self._scripts.submit((script, keys, args))

    async def _send_scripts(self, calls: list[tuple[AsyncScript, list, list]]) -> list:
        if len(calls) == 1:
            script, keys, args = calls[0]
            return [await _outcome(script(keys=keys, args=args))]
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = await pipe.execute(raise_on_error=False)
        for index, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                # Redis lost its script cache (a restart): the script object loads it again.
                script, keys, args = calls[index]
                replies[index] = await _outcome(script(keys=keys, args=args))
        return replies

    async def call(self, op: str, work: Callable[[], Awaitable[T]]) -> T | None:
        """Run one Redis operation; on failure log it once and return None."""
        started = time.perf_counter()
        try:
            return await work()
        except (TimeoutError, redis.RedisError, OSError) as error:
            record_failure(op, error)
            return None
        finally:
            metrics.redis_op_seconds(op).observe(time.perf_counter() - started)

    async def elect(
        self,
        environment_id: str,
        user_id: str,
        connection_id: str,
        watch: Sequence[str] = (),
        publish: Sequence[tuple[str, bytes]] = (),
        channels: Iterable[str] = (),
    ) -> Election | None:
        """The limit, the election and which of `watch` are online, in one round trip; None on failure.

        `online` is read after this connection's own election, so it includes the user when admitted.
        Each (channel, payload) of `publish` is PUBLISHed by Redis if, and only if, this connection wins.
        `channels` (the user's channel ids) are kept beside the deadline for the reaper.
        """
        t = self.timings
        keys = [
            connections_key(environment_id, user_id),
            presence_key(environment_id, user_id),
            marker_key(environment_id, user_id),
            DEADLINES,
            channels_key(environment_id, user_id),
            EPOCH,
        ]
        name = member(environment_id, user_id)
        args = [connection_id, t.ttl, t.grace, t.max_connections, name, environment_id, fresh_epoch()]
        args.append(",".join(channels))
        args += [len(publish), *(part for pair in publish for part in pair), *watch]
        reply = await self.call("admit", lambda: self._script(self._admit, keys, args))
        if reply is None:
            return None
        return Election(
            admitted=bool(reply[0]),
            won=reply[1] == 1,
            online=[_text(uid) for uid in reply[2:]],
            unretracted=reply[1] == 2,
        )

    async def release(self, environment_id: str, user_id: str, connection_id: str, *, last_local: bool) -> str | None:
        """Free the connection's slot and, on the last local close, re-pin the key to the grace.

        Returns the epoch Redis was in (for the grace check), or None when it did not answer.
        """
        keys = [connections_key(environment_id, user_id), presence_key(environment_id, user_id), EPOCH]
        args = [connection_id, self.timings.grace, "1" if last_local else "0", fresh_epoch()]
        reply = await self.call("release", lambda: self._script(self._release, keys, args))
        return None if reply is None else _text(reply)

    async def grace_check(
        self, environment_id: str, user_id: str, epoch: str | None, publish: Sequence[tuple[str, bytes]] = ()
    ) -> tuple[int, str | None] | None:
        """(0, _) = still online somewhere, (1, _) = this caller publishes `offline`, (2, _) = someone
        else did, (3, epoch now) = Redis lost its data since the close, which saw `epoch`: ask again
        after a refresh interval, in the new epoch. None when Redis did not answer.

        Each (channel, payload) of `publish` is PUBLISHed by Redis on 1, in the same round trip.
        """
        keys = [
            presence_key(environment_id, user_id),
            marker_key(environment_id, user_id),
            DEADLINES,
            channels_key(environment_id, user_id),
            EPOCH,
        ]
        args = [self.timings.marker_ttl, member(environment_id, user_id), epoch or "", fresh_epoch()]
        args += [part for pair in publish for part in pair]
        reply = await self.call("grace_check", lambda: self._script(self._grace_check, keys, args))
        if reply is None:
            return None
        return int(reply[0]), (_text(reply[1]) if len(reply) > 1 else epoch)

    async def refresh(
        self, held: Iterable[tuple[str, Iterable[str] | None, Sequence[str]]]
    ) -> tuple[list[tuple[str, bool]], list[str]] | None:
        """Refresh every held (`{env}:{user}`, channel ids to write or None, connection ids).

        Returns the re-elected users (with whether an `offline` marker stood) and the users whose
        channels Redis no longer has; None when Redis did not answer.
        """
        args: list = [self.timings.ttl, self.timings.grace, fresh_epoch()]
        for name, channels, connection_ids in held:
            args += [name, "" if channels is None else "=" + ",".join(channels), len(connection_ids), *connection_ids]
        reply = await self.call("refresh", lambda: self._refresh(keys=[DEADLINES, EPOCH], args=args))
        if reply is None:
            return None
        vanished, unwritten = reply
        return (
            [(_text(vanished[i]), bool(vanished[i + 1])) for i in range(0, len(vanished), 2)],
            [_text(name) for name in unwritten],
        )

    async def reap(self, publish_prefix: str | None = None) -> Reaped | None:
        """Take up to REAP_BATCH due deadlines of users nobody refreshes, and decide each.

        With `publish_prefix` (the Redis channel prefix of the presence groups, on this Redis),
        each winner's `offline` is PUBLISHed inside the script; without it the caller publishes.
        """
        t = self.timings
        args = [t.marker_ttl, t.grace, REAP_BATCH, t.refresh, fresh_epoch(), str(uuid.uuid4()), publish_prefix or ""]
        reply = await self.call("reap", lambda: self._reap(keys=[DEADLINES, EPOCH], args=args))
        if reply is None:
            return None
        decided = [
            (_text(reply[i]), bool(reply[i + 1]), [c for c in _text(reply[i + 2]).split(",") if c])
            for i in range(1, len(reply), 3)
        ]
        return Reaped(due=int(reply[0]), decided=decided)

    async def online(self, environment_id: str, user_ids: Sequence[str]) -> list[str] | None:
        """Return which of the environment's `user_ids` are online now, in one MGET."""
        if not user_ids:
            return []
        keys = [presence_key(environment_id, user_id) for user_id in user_ids]
        values = await self.call("snapshot", lambda: self.client.mget(keys))
        if values is None:
            return None
        return [user_id for user_id, value in zip(user_ids, values, strict=True) if value is not None]

    async def forget_connections(self, held: Sequence[tuple[tuple[str, str], Sequence[str]]]) -> None:
        """Free the slots of connections an instance drops as it shuts down, in one round trip."""
        if not held:
            return

        async def work() -> None:
            pipe = self.client.pipeline(transaction=False)
            for (environment_id, user_id), connection_ids in held:
                if connection_ids:
                    pipe.zrem(connections_key(environment_id, user_id), *connection_ids)
            await pipe.execute()

        await self.call("shutdown", work)

    async def close(self) -> None:
        """Close the client's connections."""
        await self.client.aclose()


async def _outcome(call: Awaitable[T]) -> T | Exception:
    """The call's reply, or the exception it raised (for a batch, whose calls fail one by one)."""
    try:
        return await call
    except Exception as error:
        return error


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


_sync_clients: dict[str, redis.Redis] = {}


def sync_client() -> redis.Redis:
    """The process's blocking presence client (HTTP views and admin run in threads)."""
    url = settings.RELAY_PRESENCE_REDIS_URL
    client = _sync_clients.get(url)
    if client is None:
        client = redis_clients.sync_client(url, retry=Retry(NoBackoff(), 0), **_client_options())
        _sync_clients[url] = client
    return client


def online_members() -> dict[str, list[str]] | None:
    """Every online user by environment id, from one pass over the presence keys; None on failure.

    A SCAN rather than an MGET of every user in the table: its cost follows the keyspace
    (what is online) instead of the user table, and it never blocks Redis like KEYS would.
    """
    started = time.perf_counter()
    found: dict[str, list[str]] = {}
    try:
        for raw in sync_client().scan_iter(match="presence:*", count=1000):
            name = _text(raw)[len("presence:") :]
            environment_id, _, user_id = name.partition(":")
            # Markers, connection sets and the deadline set share the prefix; only
            # `presence:{env uuid}:{user}` means online.
            if len(environment_id) == 36 and user_id and environment_id.count("-") == 4:
                found.setdefault(environment_id, []).append(user_id)
    except (redis.RedisError, OSError) as error:
        record_failure("online_members", error)
        return None
    finally:
        metrics.redis_op_seconds("online_members").observe(time.perf_counter() - started)
    return {environment_id: sorted(users) for environment_id, users in found.items()}


def online_flags(subjects: Sequence[tuple[str, str]], op: str = "online_flags") -> list[bool] | None:
    """Return, for each (environment id, user id), whether they are online now; None on failure.

    One round trip for the whole list (MGET), logged as `presence.failed` when Redis is down.
    """
    if not subjects:
        return []
    started = time.perf_counter()
    try:
        values = sync_client().mget([presence_key(env, user) for env, user in subjects])
    except (redis.RedisError, OSError) as error:
        record_failure(op, error)
        return None
    finally:
        metrics.redis_op_seconds(op).observe(time.perf_counter() - started)
    return [value is not None for value in values]


def announce(environment_id: str, user_id: str, publish: Sequence[tuple[str, bytes]]) -> bool | None:
    """PUBLISH each (channel, payload) of `publish` if, and only if, the user is online now.

    Returns whether they were; None when Redis did not answer (logged as `presence.failed`).
    """
    started = time.perf_counter()
    try:
        script = sync_client().register_script(ANNOUNCE)
        return bool(script(keys=[presence_key(environment_id, user_id)], args=[p for pair in publish for p in pair]))
    except (redis.RedisError, OSError) as error:
        record_failure("announce", error)
        return None
    finally:
        metrics.redis_op_seconds("announce").observe(time.perf_counter() - started)
