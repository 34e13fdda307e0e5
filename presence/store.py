"""The async presence store: one fail-fast client per event loop that runs presence/scripts.py.

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

from presence.scripts import (
    ADMIT,
    DEADLINES,
    EPOCH,
    GRACE_CHECK,
    REAP,
    REFRESH,
    RELEASE,
    channels_key,
    connections_key,
    fresh_epoch,
    marker_key,
    member,
    presence_key,
)
from relay import metrics, redis_clients
from relay.batching import GroupCommit
from relay.logging import log_event
from relay.transport.hiredis import pack_with_hiredis

logger = logging.getLogger("presence")

T = TypeVar("T")

# Long enough to fail over to a dead peer, short enough that a dead store is noticed on the
# call that hit it rather than after a queue of them (docs/presence.md, Failure behaviour).
TIMEOUT_SECONDS = 0.5
# How many due deadlines one REAP script takes: a pass runs scripts until fewer are due, and
# one script of this size holds Redis for a few milliseconds.
REAP_BATCH = 1000
MAX_ERROR_LENGTH = 200


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
        """When the grace check runs after a close: never on the grace itself (docs/presence.md)."""
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


def client_options() -> dict:
    """The fail-fast socket options every presence client uses, async or blocking."""
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
        self.client = redis_clients.async_client(url, retry=AsyncRetry(NoBackoff(), 0), **client_options())
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
            online=[as_text(uid) for uid in reply[2:]],
            unretracted=reply[1] == 2,
        )

    async def release(self, environment_id: str, user_id: str, connection_id: str, *, last_local: bool) -> str | None:
        """Free the connection's slot and, on the last local close, re-pin the key to the grace.

        Returns the epoch Redis was in (for the grace check), or None when it did not answer.
        """
        keys = [connections_key(environment_id, user_id), presence_key(environment_id, user_id), EPOCH]
        args = [connection_id, self.timings.grace, "1" if last_local else "0", fresh_epoch()]
        reply = await self.call("release", lambda: self._script(self._release, keys, args))
        return None if reply is None else as_text(reply)

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
        return int(reply[0]), (as_text(reply[1]) if len(reply) > 1 else epoch)

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
            [(as_text(vanished[i]), bool(vanished[i + 1])) for i in range(0, len(vanished), 2)],
            [as_text(name) for name in unwritten],
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
            (as_text(reply[i]), bool(reply[i + 1]), [c for c in as_text(reply[i + 2]).split(",") if c])
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


def as_text(value: bytes | str) -> str:
    """A reply as text (the clients answer bytes)."""
    return value.decode() if isinstance(value, bytes) else value
