"""The async presence store: one fail-fast client per event loop that runs presence/scripts.py.

Nothing here is a source of truth: presence is ephemeral, and a flushed Redis self-heals through
the refresh. Every call FAILS FAST (short timeouts, no retries; a connect's or close's script waits
at most for the one pipeline ahead of it) and a failure is logged once per call as
`presence.failed {op, error}` and answered with None, so presence degrades alone.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import redis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisClusterException

from presence.keys import BUCKETS, user_bucket
from presence.scripts import (
    ADMIT,
    CHANNEL_SEEN,
    CHANNEL_UNSEEN,
    DUE,
    EXISTS_EACH,
    GRACE_CHECK,
    REAP,
    REFRESH,
    RELEASE,
    channel_online_key,
    channels_key,
    connections_key,
    deadlines_key,
    epoch_key,
    fresh_epoch,
    marker_key,
    member,
    member_bucket,
    presence_key,
    split_member,
    user_deadlines_key,
    user_epoch_key,
)
from relay import metrics, redis_clients
from relay.batching import GroupCommit
from relay.logging import Event, log_event
from relay.transport.cluster import closed_under_a_write, cluster_client, queue_script
from relay.transport.hiredis import pack_with_hiredis
from webhooks.stream import bucket_stream_keys, user_stream_keys

logger = logging.getLogger("presence")

T = TypeVar("T")

# Long enough to fail over to a dead peer, short enough that a dead store is noticed on the
# call that hit it rather than after a queue of them (docs/presence.md, Failure behaviour).
TIMEOUT_SECONDS = 0.5
# How many due deadlines one REAP script takes (one bucket's): a pass runs scripts until fewer
# are due in every bucket, and one script of this size holds Redis for a few milliseconds.
REAP_BATCH = 1000
MAX_ERROR_LENGTH = 200


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


def record_failure(op: str, error: BaseException) -> None:
    """Log `presence.failed {op, error}` once for one failed operation, without a traceback."""
    metrics.PRESENCE_FAILURES.labels(op=op).inc()
    log_event(logger, Event.PRESENCE_FAILED, logging.ERROR, op=op, error=_short(error))


@dataclass(frozen=True)
class Election:
    """The outcome of one connection's election: let in, won, and who of those asked is online."""

    admitted: bool
    won: bool
    online: list[str]
    # The key was gone but the user's last `online` was never retracted (their instance died):
    # this connection took the key over and has nothing to publish.
    unretracted: bool = False
    # How many are online in each of the user's large channels (counted, not listed).
    occupancy: dict[str, int] = field(default_factory=dict)
    # The epoch Redis is in, and how long ago (ms) it began (docs/presence.md, Redis loses its data).
    epoch: str | None = None
    epoch_age_ms: int = 0
    # When `unretracted`: the channels the user's `online` could reach (kept beside the deadline
    # before this connection's), None when none were kept.
    heard: frozenset[str] | None = None


@dataclass(frozen=True)
class Reaped:
    """One reaper pass's answer: the most deadlines due in one bucket, and the users it decided."""

    due: int
    # (member, won the offline election, the channel ids kept beside the deadline, the id of the
    # `offline` the script published: "" when it published none)
    decided: list[tuple[str, bool, list[str], str]]
    # The winners that were invisible: their watchers heard `offline` already, and were told nothing.
    hidden: frozenset[str] = frozenset()
    # Redis's time just before the script decided them (ms): the bound of their channel entries' removal.
    decided_ms: int = 0


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
        instead of publishing a second `offline`. And as long as a channel entry written before
        the decision (`seen_for`, the same length): a snapshot that read such an entry finds the
        marker and leaves the user out (`said_offline`). A longer life is harmless: a marker only
        ever stands while the last published state is `offline`, and the next `online` deletes it.
        """
        return self.seen_for

    @property
    def rejoin(self) -> int:
        """How long after Redis lost its data every live holder has re-elected its users.

        Two refresh intervals (a holder's first call after a restart can fail on a connection the
        restart closed) and a margin.
        """
        return 2 * self.refresh + self.margin

    @property
    def seen_for(self) -> int:
        """How long a holder's write keeps a user in their channels' online sets (CHANNEL_SEEN).

        Past the reaper's decision (last refresh + TTL + grace, taken up to a refresh later): a
        dead instance's users must stay listed until their `offline` is said, since one who
        comes back before it publishes nothing. Whoever decides `offline` takes the entries out
        (`channels_gone`); every holder writes this same length, so an entry scored below the
        decision + this was written before the decision.
        """
        return self.ttl + self.grace + self.margin + 2 * self.refresh

    @property
    def epoch_ttl(self) -> int:
        """How long the epoch lives past the last refresh that renewed it.

        No deadline in a dump can be due before the dump's epoch has expired: a deadline is
        written by a refresh at most one interval before the epoch's last renewal, and lasts
        TTL + grace from it. Two intervals at least, so the epoch never lapses between refreshes.
        """
        return max(self.ttl + self.grace - self.refresh, 2 * self.refresh)


def client_options() -> dict:
    """The fail-fast socket options every presence client uses, async or blocking."""
    return {
        "socket_connect_timeout": TIMEOUT_SECONDS,
        "socket_timeout": TIMEOUT_SECONDS,
        "health_check_interval": 0,
    }


class PresenceStore:
    """The async presence client of one event loop, with its scripts and fail-fast wrapper.

    On a Redis Cluster (`cluster_nodes`) the client is redis-py's `RedisCluster`, which sends each
    script to the master of its keys' slot (all of one bucket or one channel: presence/scripts.py);
    of `url` only the user, the password and TLS apply then.
    """

    def __init__(self, url: str, timings: Timings, cluster_nodes: Sequence[tuple[str, int]] = ()) -> None:
        self.url = url
        self.timings = timings
        self.clustered = bool(cluster_nodes)
        if cluster_nodes:
            # One retry, no back-off: a connection error re-reads the slot map (a failover) and
            # tries once more on the master named there, then fails fast like a single Redis.
            self.client = cluster_client(
                cluster_nodes,
                timeout=TIMEOUT_SECONDS,
                retry=AsyncRetry(NoBackoff(), 1),
                **redis_clients.cluster_options(url),
            )
        else:
            # retries=0: redis-py retries three times with backoff by default, which turns a dead
            # store into a stall on every call instead of one quick, logged failure.
            self.client = redis_clients.async_client(url, retry=AsyncRetry(NoBackoff(), 0), **client_options())
            pack_with_hiredis(self.client.connection_pool)
        self._admit = self.client.register_script(ADMIT)
        self._release = self.client.register_script(RELEASE)
        self._grace_check = self.client.register_script(GRACE_CHECK)
        self._refresh = self.client.register_script(REFRESH)
        self._due = self.client.register_script(DUE)
        self._reap = self.client.register_script(REAP)
        self._channel_seen = self.client.register_script(CHANNEL_SEEN)
        self._channel_unseen = self.client.register_script(CHANNEL_UNSEEN)
        self._exists_each = self.client.register_script(EXISTS_EACH)
        # A connect's or close's script goes with the calls made while one round trip is in flight
        # (relay.batching). One call each would put hundreds in flight in a burst, each queued
        # behind the others' set-up on redis-py's pool lock. A call alone goes at once.
        self._scripts: GroupCommit[tuple[AsyncScript, list, list | None], object] = GroupCommit(self._batch)
        # Scripts of other modules (presence/status.py), registered on first use.
        self._registered: dict[str, AsyncScript] = {}

    def script(self, source: str) -> AsyncScript:
        """This store's handle on `source`, registered once (it carries the SHA the calls use)."""
        script = self._registered.get(source)
        if script is None:
            script = self._registered[source] = self.client.register_script(source)
        return script

    async def run_script(self, script: AsyncScript, keys: list, args: list) -> object:
        """Run `script` (its keys of one slot) in the next batch of this store's script calls."""
        return await self._scripts.submit((script, keys, args))

    async def read_each(self, script: AsyncScript, keys: list[str]) -> list:
        """`script`'s value of each of `keys`, in the next batch of script calls.

        For a read without ARGV whose reply holds one value per key, in order. The batch's reads of
        one script go as ONE call per slot (any call on one Redis) with each key once: a burst of
        connects into one channel reads its members' statuses once per round trip, not once per
        connect (a thousand connects into a room of a thousand were megabytes of keys sent).
        """
        if not keys:
            return []
        return cast(list, await self._scripts.submit((script, keys, None)))

    async def _batch(self, calls: list[tuple[AsyncScript, list, list | None]]) -> list:
        """Each call's outcome in order, the reads of `read_each` (ARGV None) merged per script and slot."""
        sent = [(script, keys, args) for script, keys, args in calls if args is not None]
        if len(sent) == len(calls):
            return await self._send_scripts(sent)
        merged: dict[tuple[AsyncScript, int], dict[str, None]] = {}
        for script, keys, args in calls:
            if args is None:
                for key in keys:
                    merged.setdefault((script, self.client.keyslot(key) if self.clustered else 0), {})[key] = None
        reads = [(script, list(keys), []) for (script, _), keys in merged.items()]
        replies = await self._send_scripts(sent + reads)
        values: dict[tuple[AsyncScript, str], object] = {}
        for (script, keys, _), reply in zip(reads, replies[len(sent) :], strict=True):
            each = [reply] * len(keys) if isinstance(reply, Exception) else reply
            values.update(((script, key), value) for key, value in zip(keys, each, strict=True))
        outcomes = iter(replies[: len(sent)])
        return [next(outcomes) if args is not None else _read(script, keys, values) for script, keys, args in calls]

    async def _send_scripts(self, calls: list[tuple[AsyncScript, list, list]]) -> list:
        if len(calls) == 1:
            script, keys, args = calls[0]
            return [await _outcome(script(keys=keys, args=args))]
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            queue_script(pipe, script.sha, keys, args)
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
        except (TimeoutError, redis.RedisError, RedisClusterException, OSError, RuntimeError) as error:
            # RuntimeError: under uvloop, a write on a connection that a reset has just closed
            # (before redis-py noticed) raises it instead of a ConnectionError. The same failure.
            # RedisClusterException: a cluster whose slot has no master yet (a failover).
            record_failure(op, error)
            return None
        except AttributeError as error:
            # A connection another task disconnected (a cluster client closes them all when one
            # node fails): relay/transport/cluster.py, `closed_under_a_write`.
            if not closed_under_a_write(error):
                raise
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
        large: Collection[str] = (),
        hidden: bool = False,
        ahead: Sequence[tuple[AsyncScript, list, list]] = (),
    ) -> Election | None:
        """The limit, the election and which of `watch` are online, in one round trip; None on failure.

        `online` is read after this connection's own election, so it includes the user when admitted.
        Each (channel, payload) of `publish` is PUBLISHed by Redis if, and only if, this connection wins.
        `channels` (the user's channel ids) are kept beside the deadline for the reaper, and the
        user is added to each channel's online set, whose members (those in `watch`) are the
        snapshot: one read per channel, not one per co-member. Of a `large` channel the read is
        a count (the snapshot's occupancy), whatever the channel's size. A refused connection's
        user is online elsewhere already, so the additions stand either way. `ahead`: script calls
        (script, keys, args) of the user's bucket that run first in the same round trip.
        """
        t = self.timings
        keys = [
            connections_key(environment_id, user_id),
            presence_key(environment_id, user_id),
            marker_key(environment_id, user_id),
            user_deadlines_key(environment_id, user_id),
            channels_key(environment_id, user_id),
            user_epoch_key(environment_id, user_id),
            *user_stream_keys(environment_id, user_id),
        ]
        name = member(environment_id, user_id)
        channels = list(channels)
        args = [connection_id, t.ttl, t.grace, t.max_connections, name, environment_id, fresh_epoch()]
        args.append(",".join(channels))
        args += [len(publish), *(part for pair in publish for part in pair), "1" if hidden else "0"]
        # An invisible user is in no online set: neither counted nor listed to others.
        counted = [] if hidden else [user_id]

        def work() -> Awaitable[list]:
            # Submitted together, so they go in one pipeline, the election first.
            seen = [
                self._seen(channel_id, t.seen_for, "count" if channel_id in large else "members", counted)
                for channel_id in channels
            ]
            before = [self.run_script(*call) for call in ahead]
            return asyncio.gather(*before, self.run_script(self._admit, keys, args), *seen)

        replies = await self.call("admit", work)
        if replies is None:
            return None
        reply, *members = replies[len(ahead) :]
        wanted = set(watch)
        occupancy = {c: int(found) for c, found in zip(channels, members, strict=True) if c in large}
        online = {as_text(uid) for c, found in zip(channels, members, strict=True) if c not in large for uid in found}
        if reply[0]:
            online.add(user_id)  # online by this very election, even in no channel
        return Election(
            admitted=bool(reply[0]),
            won=reply[1] == 1,
            online=sorted(online & wanted),
            unretracted=reply[1] == 2,
            occupancy=occupancy,
            epoch=as_text(reply[2]) if len(reply) > 2 else None,
            epoch_age_ms=int(reply[3]) if len(reply) > 3 else 0,
            heard=_heard(reply[4]) if len(reply) > 4 else None,
        )

    async def release(self, environment_id: str, user_id: str, connection_id: str, *, last_local: bool) -> str | None:
        """Free the connection's slot and, on the last local close, re-pin the key to the grace.

        Returns the epoch Redis was in (for the grace check), or None when it did not answer.
        """
        keys = [
            connections_key(environment_id, user_id),
            presence_key(environment_id, user_id),
            user_epoch_key(environment_id, user_id),
        ]
        args = [connection_id, self.timings.grace, "1" if last_local else "0", fresh_epoch()]
        reply = await self.call("release", lambda: self.run_script(self._release, keys, args))
        return None if reply is None else as_text(reply)

    async def grace_check(
        self,
        environment_id: str,
        user_id: str,
        epoch: str | None,
        publish: Sequence[tuple[str, bytes]] = (),
        channels: Sequence[str] = (),
        last_seen_ms: int | None = None,
        token: str | None = None,
    ) -> tuple[int, str | None, int | None] | None:
        """(0, _, _) = still online somewhere, (1, _, when) = this caller publishes `offline`, decided
        at `when` (Redis ms), (2, _, _) = someone else did, (3, epoch now, _) = Redis lost its data
        since the close, which saw `epoch`: ask again after a refresh interval, in the new epoch,
        (4, _, when) = an earlier try of this check (the same `token`; one of its own when None)
        decided, and its reply was lost: nothing was PUBLISHed now. None when Redis did not answer.

        Each (channel, payload) of `publish` is PUBLISHed by Redis on 1, in the same round trip;
        so is the webhook event (with `channels` and `last_seen_ms`) when the environment listens.
        """
        keys = [
            presence_key(environment_id, user_id),
            marker_key(environment_id, user_id),
            user_deadlines_key(environment_id, user_id),
            channels_key(environment_id, user_id),
            user_epoch_key(environment_id, user_id),
            *user_stream_keys(environment_id, user_id),
        ]
        args = [self.timings.marker_ttl, member(environment_id, user_id), epoch or "", fresh_epoch()]
        args.append(token or str(uuid.uuid4()))
        if len(keys) > 5:
            args += [",".join(channels), last_seen_ms or int(time.time() * 1000)]
        args += [part for pair in publish for part in pair]
        reply = await self.call("grace_check", lambda: self.run_script(self._grace_check, keys, args))
        if reply is None:
            return None
        outcome = int(reply[0])
        if outcome in (1, 4):
            return outcome, epoch, int(reply[1])
        return outcome, (as_text(reply[1]) if len(reply) > 1 else epoch), None

    async def refresh(
        self, held: Iterable[tuple[str, Iterable[str] | None, Sequence[str]]]
    ) -> tuple[list[tuple[str, bool]], list[str]] | None:
        """Refresh every held (`{env}:{user}`, channel ids to write or None, connection ids).

        One REFRESH per bucket, pipelined (one round trip per master on a cluster). Returns the
        re-elected users (with whether an `offline` marker stood) and the users whose channels
        Redis no longer has (those of a bucket whose script failed among them, so they are sent
        again); None when Redis answered for no bucket.
        """
        t = self.timings
        by_bucket: dict[int, tuple[list, list, list[str]]] = {}
        for name, channels, connection_ids in held:
            bucket = member_bucket(name)
            keys, args, names = by_bucket.setdefault(
                bucket, ([deadlines_key(bucket), epoch_key(bucket)], [t.ttl, t.grace, fresh_epoch(), t.epoch_ttl], [])
            )
            environment_id, user_id = split_member(name)
            keys += [
                presence_key(environment_id, user_id),
                marker_key(environment_id, user_id),
                connections_key(environment_id, user_id),
                channels_key(environment_id, user_id),
            ]
            args += [name, "" if channels is None else "=" + ",".join(channels), len(connection_ids), *connection_ids]
            names.append(name)
        if not by_bucket:
            return [], []
        calls = [(self._refresh, keys, args) for keys, args, _ in by_bucket.values()]
        replies = await self.call("refresh", lambda: self._send_scripts(calls))
        if replies is None or not self._answered_any("refresh", replies):
            return None
        vanished: list[tuple[str, bool]] = []
        unwritten: list[str] = []
        for (_, _, names), reply in zip(by_bucket.values(), replies, strict=True):
            if isinstance(reply, Exception):
                unwritten += names
                continue
            gone, missing = reply
            vanished += [(as_text(gone[i]), bool(gone[i + 1])) for i in range(0, len(gone), 2)]
            unwritten += [as_text(name) for name in missing]
        return vanished, unwritten

    async def write_event(self, environment_id: str, user_id: str, state: str, channels: Iterable[str]) -> None:
        """Write a transition decided outside the scripts (a refresh's re-election) to the user's
        webhook stream, when the environment listens: after the decision, not atomic with it."""
        keys = user_stream_keys(environment_id, user_id)
        if keys:
            fields = {"t": f"user.{state}", "e": environment_id, "u": user_id, "c": ",".join(sorted(channels))}
            await self.call("webhook_event", lambda: self.client.xadd(keys[0], fields))

    async def reap(self, publish_prefix: str | None = None) -> Reaped | None:
        """Take up to REAP_BATCH due deadlines of each bucket, of users nobody refreshes, and decide each.

        One DUE per bucket (pipelined), then one REAP per bucket that has any, pipelined in round
        trips of about REAP_BATCH users (one round trip holds Redis no longer than one script of a
        batch would: a reply that came too late would leave decisions unlogged). With
        `publish_prefix` (the Redis channel prefix of the presence groups, on this Redis), each
        winner's `offline` is PUBLISHed inside the script; without it the caller publishes.
        A bucket whose script failed is left to the next pass; None when no bucket answered.
        """
        t = self.timings
        due_calls = [
            (self._due, [deadlines_key(bucket), epoch_key(bucket)], [fresh_epoch(), t.epoch_ttl, REAP_BATCH])
            for bucket in range(BUCKETS)
        ]
        found = await self.call("reap", lambda: self._send_scripts(due_calls))
        if found is None or not self._answered_any("reap", found):
            return None
        # Per bucket, Redis's time as DUE ran (on the bucket's own node in a cluster) and the due members.
        read_at = {bucket: int(reply[0]) for bucket, reply in enumerate(found) if _is_list(reply)}
        due = {bucket: [as_text(name) for name in reply[1]] for bucket, reply in enumerate(found) if _is_list(reply)}
        # A deadline of another epoch waits two refresh intervals, not one: a holder's first call
        # after Redis restarted can fail on a connection the restart closed (no retries here).
        wait = 2 * t.refresh
        # A REAP that runs later than a call may wait after its DUE found Redis silent in between
        # (a pause, a stall): a holder may have let a user in without an election meanwhile, so
        # the script decides nothing and the next pass, which waits for the holders, looks again.
        silent_ms = round(TIMEOUT_SECONDS * 1000)
        calls = []
        for bucket, names in due.items():
            if not names:
                continue
            streams, listening = bucket_stream_keys(bucket)
            keys = [deadlines_key(bucket), epoch_key(bucket), *streams]
            for name in names:
                environment_id, user_id = split_member(name)
                keys += [
                    presence_key(environment_id, user_id),
                    channels_key(environment_id, user_id),
                    marker_key(environment_id, user_id),
                ]
            args = [t.marker_ttl, t.grace, wait, fresh_epoch(), str(uuid.uuid4()), publish_prefix or "", listening]
            calls.append((self._reap, keys, [*args, t.ttl, read_at[bucket] + silent_ms, *names]))
        most = max((len(names) for names in due.values()), default=0)
        if not calls:
            return Reaped(due=most, decided=[])
        # Redis's time before the scripts: no decision is older, and an entry in an online set
        # written after a decision scores at least decision + seen_for (`channels_gone`).
        decided_ms = min(read_at[bucket] for bucket, names in due.items() if names)
        decided: list[tuple[str, bool, list[str], str]] = []
        hidden: set[str] = set()
        for chunk in _chunks(calls):
            replies = await self.call("reap", lambda chunk=chunk: self._send_scripts(chunk))
            if replies is None or not self._answered_any("reap", replies):
                # What was decided stands (and is the caller's to publish); the rest waits for the next pass.
                return (
                    Reaped(due=0, decided=decided, decided_ms=decided_ms, hidden=frozenset(hidden)) if decided else None
                )
            answered = [reply for reply in replies if _is_list(reply)]
            decided += [
                (
                    as_text(reply[i]),
                    bool(reply[i + 1]),
                    [c for c in as_text(reply[i + 2]).split(",") if c],
                    as_text(reply[i + 3]),
                )
                for reply in answered
                for i in range(0, len(reply), 4)
            ]
            hidden.update(
                as_text(reply[i]) for reply in answered for i in range(0, len(reply), 4) if int(reply[i + 1]) == 2
            )
        return Reaped(due=most, decided=decided, decided_ms=decided_ms, hidden=frozenset(hidden))

    @staticmethod
    def _answered_any(op: str, replies: list) -> bool:
        """Log the first failed script of a pipeline; False when every one failed."""
        failed = [reply for reply in replies if isinstance(reply, Exception)]
        if failed:
            record_failure(op, failed[0])
        return len(failed) < len(replies)

    async def channels_seen(self, seen: dict[str, list[str]], for_ms: int, op: str = "channels_seen") -> None:
        """Mark each channel's users online for `for_ms` from now (GT: never shortening), one script per channel."""
        if not seen:
            return

        await self.call(op, lambda: asyncio.gather(*(self._seen(c, for_ms, "", users) for c, users in seen.items())))

    async def epoch(self, environment_id: str, user_id: str) -> str | None:
        """The epoch the user's bucket is in now ("" when it has none); None when Redis did not answer."""

        async def work() -> str:
            return as_text(await self.client.get(user_epoch_key(environment_id, user_id)) or b"")

        return await self.call("epoch", work)

    async def occupancy(self, channel_ids: Sequence[str]) -> dict[str, int] | None:
        """How many are online in each channel now, one count per channel; None on failure."""

        async def work() -> list:
            return await asyncio.gather(*(self._seen(c, self.timings.ttl, "count", []) for c in channel_ids))

        counts = await self.call("occupancy", work)
        return None if counts is None else {c: int(n) for c, n in zip(channel_ids, counts, strict=True)}

    async def channel_members(self, channel_id: str) -> list[str] | None:
        """The user ids online in one channel now; None on failure."""
        found = await self.call("channel_members", lambda: self._seen(channel_id, self.timings.ttl, "members", []))
        return None if found is None else [as_text(uid) for uid in found]

    def _seen(self, channel_id: str, for_ms: int, answer: str, user_ids: Sequence[str]) -> Awaitable[object]:
        return self.run_script(self._channel_seen, [channel_online_key(channel_id)], [for_ms, answer, *user_ids])

    async def channels_gone(self, gone: Sequence[tuple[str, Iterable[str]]], decided_ms: int | None = None) -> None:
        """Take each (user id, channel ids) out of those channels' online sets.

        `decided_ms`: when their `offline` was decided (the grace check's answer); only entries
        written before it go, so a user back since (their connect wrote the entry after the
        decision, maybe before this call) stays. None: every entry goes (a membership ended).
        """
        removals = [(channel_id, user_id) for user_id, channel_ids in gone for channel_id in channel_ids]
        if not removals:
            return

        async def work() -> None:
            if decided_ms is not None:
                # An entry written at the decision's own time or later lasts until then + seen_for or longer.
                bound = decided_ms + self.timings.seen_for
                # One script per channel: a reaper's batch takes out many users of the same ones.
                by_channel: dict[str, list[str]] = {}
                for channel_id, user_id in removals:
                    by_channel.setdefault(channel_id, []).append(user_id)
                unseen = [
                    self.run_script(self._channel_unseen, [channel_online_key(c)], [bound, *users])
                    for c, users in by_channel.items()
                ]
                await asyncio.gather(*unseen)
                return
            pipe = self.client.pipeline(transaction=False)
            for channel_id, user_id in removals:
                pipe.zrem(channel_online_key(channel_id), user_id)
            await pipe.execute()

        await self.call("channels_gone", work)

    async def online(self, environment_id: str, user_ids: Sequence[str]) -> list[str] | None:
        """Return which of the environment's `user_ids` are online as watchers were last told, in one round trip.

        That is their key, or a standing deadline: a departure not yet decided (the key re-pinned to
        the grace expired before the check, or a dead instance's before the reaper) still reads
        online, as the ADMIT script's snapshot does.
        """
        if not user_ids:
            return []
        by_bucket: dict[int, list[str]] = {}
        for user_id in user_ids:
            by_bucket.setdefault(user_bucket(environment_id, user_id), []).append(user_id)

        async def work() -> list:
            # An MGET and a ZMSCORE per bucket: each reads one slot.
            async with self.client.pipeline(transaction=False) as pipe:
                for bucket, users in by_bucket.items():
                    # As a command: a cluster's pipeline refuses its `mget` method, though an MGET
                    # of one slot's keys routes like any keyed command.
                    pipe.execute_command("MGET", *(presence_key(environment_id, user_id) for user_id in users))
                    pipe.zmscore(deadlines_key(bucket), [member(environment_id, user_id) for user_id in users])
                return await pipe.execute()

        replies = await self.call("snapshot", work)
        if replies is None:
            return None
        online = set()
        for index, users in enumerate(by_bucket.values()):
            values, deadlines = replies[2 * index], replies[2 * index + 1]
            online.update(
                user_id
                for user_id, value, deadline in zip(users, values, deadlines, strict=True)
                if value is not None or deadline is not None
            )
        return [user_id for user_id in user_ids if user_id in online]

    async def said_offline(self, environment_id: str, user_ids: Sequence[str]) -> set[str]:
        """Which of the environment's `user_ids` were said `offline` and not elected since.

        For a snapshot read from the channels' online sets, which keep a user said `offline` until
        the decider's next call takes them out (`channels_gone`): a watcher that joined its groups
        after that `offline` went out must not list them. Read in the batch of script calls the
        snapshot's status read goes in. Empty when Redis did not answer (logged): the snapshot
        stands as read.
        """
        if not user_ids:
            return set()
        keys = [
            key
            for user_id in user_ids
            for key in (presence_key(environment_id, user_id), marker_key(environment_id, user_id))
        ]
        found = await self.call("snapshot", lambda: self.read_each(self._exists_each, keys))
        if found is None:
            return set()
        return {
            user_id
            for user_id, key, marker in zip(user_ids, found[::2], found[1::2], strict=True)
            if marker and not key
        }

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


def _read(script: AsyncScript, keys: list, values: dict[tuple[AsyncScript, str], object]) -> list | Exception:
    """One `read_each` caller's values, or the error its keys' call failed with."""
    read = [values[(script, key)] for key in keys]
    return next((value for value in read if isinstance(value, Exception)), read)


async def _outcome(call: Awaitable[T]) -> T | Exception:
    """The call's reply, or the exception it raised (for a batch, whose calls fail one by one)."""
    try:
        return await call
    except Exception as error:
        return error


def _chunks(calls: list[tuple[AsyncScript, list, list]]) -> list[list[tuple[AsyncScript, list, list]]]:
    """REAP calls in round trips of about REAP_BATCH users each: one holds Redis as long as one
    script of a batch would (a REAP call's ARGV ends with its users, after 9 settings)."""
    chunks: list[list[tuple[AsyncScript, list, list]]] = []
    size = REAP_BATCH
    for call in calls:
        users = len(call[2]) - 9
        if size + users > REAP_BATCH:
            chunks.append([])
            size = 0
        chunks[-1].append(call)
        size += users
    return chunks


def _heard(reply: object) -> frozenset[str] | None:
    """ADMIT's `heard`: "=" and comma-separated channel ids, or "" for none kept."""
    text = as_text(reply)
    return frozenset(c for c in text[1:].split(",") if c) if text.startswith("=") else None


def _is_list(reply: object) -> bool:
    return isinstance(reply, list)


def as_text(value: bytes | str) -> str:
    """A reply as text (the clients answer bytes)."""
    return value.decode() if isinstance(value, bytes) else value
