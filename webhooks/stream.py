"""Presence events on their way to the outbox: one Redis Stream per bucket, read by a consumer group.

`user.online` and `user.offline` are decided in Redis by presence's scripts (presence/store.py).
The script that decides a transition also XADDs it to the stream of the user's bucket
(`webhooks:events:{b<n>}`, presence/keys.py), so the event exists exactly when the decision
does: an instance killed at any moment after its script ran leaves the event in Redis. Every
instance reads the streams with one consumer group (XREADGROUP), writes each event's Delivery
rows (idempotent by webhook id), then XACKs and XDELs it; an entry read by an instance that
died is claimed by another after RELAY_WEBHOOK_CLAIM_MS (XAUTOCLAIM).

`channel.occupied` / `channel.vacated` are derived here, from the user transitions in stream
order per user: a hash per channel (`webhooks:occupancy:{c:<id>}`) counts its online members,
and a script of that channel alone applies one transition idempotently (docs/webhooks.md says
what that guarantees).

Presence writes a stream entry only for environments that have an endpoint: which ones, every
instance reads from the database every second (`known`), never on presence's path.

On a Redis Cluster (presence there: RELAY_PRESENCE_CLUSTER_NODES) the streams live on every master
(each bucket's on the master of its slot), and one XREADGROUP may name streams of one slot only:
the consumer reads each stream with a script of its own (READ, no key named outside KEYS, so the
client routes it without asking the server for its keys), all pipelined, every POLL_SECONDS
while nothing arrives instead of blocking.
"""

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

import redis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from presence.keys import BUCKETS, bucket_tag, channel_tag, user_bucket
from relay import redis_clients
from relay.logging import Event, log_event
from relay.transport.cluster import cluster_client, queue_script
from webhooks import events, metrics

logger = logging.getLogger("webhooks")

STREAM_PREFIX = "webhooks:events:"
GROUP = "webhooks"
# Entries read per XREADGROUP; the block is short so a stopping instance leaves quickly.
READ_COUNT = 500
BLOCK_MS = 1000
# The streams are searched for a dead instance's unacknowledged entries twice per
# RELAY_WEBHOOK_CLAIM_MS, within these bounds: a search is one XAUTOCLAIM per bucket.
CLAIM_EVERY_MIN_S = 0.5
CLAIM_EVERY_MAX_S = 15.0
REFRESH_ENVIRONMENTS_S = 1.0
# On a cluster: how long the consumer waits after a read that found nothing in any stream.
POLL_SECONDS = 0.5


def stream_key(bucket: int) -> str:
    """The event stream of one bucket."""
    return STREAM_PREFIX + bucket_tag(bucket)


STREAMS = [stream_key(bucket) for bucket in range(BUCKETS)]


def occupancy_key(channel_id: str) -> str:
    """The hash that counts a channel's online members, for `channel.occupied` / `vacated`."""
    return f"webhooks:occupancy:{channel_tag(channel_id)}"


class KnownEnvironments:
    """The environments that have an enabled endpoint, as this process last read them."""

    def __init__(self) -> None:
        self.ids: frozenset[str] = frozenset()

    def wants(self, environment_id: str) -> bool:
        """Whether presence should write this environment's transitions to a stream."""
        return environment_id in self.ids


known = KnownEnvironments()


# ── what presence's scripts need ───────────────────────────────────────────────
def user_stream_keys(environment_id: str, user_id: str) -> list[str]:
    """The stream a user's transition goes to, as a one-key list; empty when nobody listens."""
    if not known.wants(environment_id):
        return []
    return [stream_key(user_bucket(environment_id, user_id))]


def bucket_stream_keys(bucket: int) -> tuple[list[str], str]:
    """The stream of one bucket as a one-key list and the listening environments (comma-separated),
    for the reaper's script of that bucket; ([], "") when nobody listens."""
    if not known.ids:
        return [], ""
    return [stream_key(bucket)], ",".join(sorted(known.ids))


# KEYS: the channel's occupancy hash. ARGV: user id, "1" online / "0" offline, the entry's
# ms and sequence (its order among the user's transitions: same user, same stream). Returns 1
# when this transition occupied (first online member) or vacated (last one gone) the channel.
# A field per user, `state|ms|seq|decided`: an older transition arriving late changes nothing,
# and the same transition applied again (consumed again after a crash) answers as it did.
OCCUPANCY = """
local field = 'u:' .. ARGV[1]
local state = ARGV[2]
local ms = tonumber(ARGV[3])
local seq = tonumber(ARGV[4])
local current = redis.call('HGET', KEYS[1], field)
local was = '0'
if current then
  local s, m, q, d = string.match(current, '^(%d)|(%d+)|(%d+)|(%d)$')
  m = tonumber(m)
  q = tonumber(q)
  if m == ms and q == seq then
    return tonumber(d)
  end
  if m > ms or (m == ms and q > seq) then
    return 0
  end
  was = s
end
local decided = 0
if state ~= was then
  local count = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
  if state == '1' then
    count = count + 1
    if count == 1 then decided = 1 end
  else
    count = math.max(count - 1, 0)
    if count == 0 then decided = 1 end
  end
  redis.call('HSET', KEYS[1], 'n', count)
end
redis.call('HSET', KEYS[1], field, state .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|' .. decided)
return decided
"""


# KEYS: one stream. ARGV: group, consumer, count. The new entries of one stream for this consumer
# (XREADGROUP without BLOCK, which a script may run), as XREADGROUP answers: {{key, {{id, {field,
# value, ...}}, ...}}}, or false when there are none.
READ = """
return redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def consumer_name() -> str:
    """This process's name in the consumer group: unique, readable in XINFO."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Consumer:
    """Reads every bucket stream through the group and turns entries into Delivery rows."""

    def __init__(self, write_rows: Callable[[list[tuple]], Awaitable[None]]) -> None:
        # write_rows: the events' Delivery rows, (environment id, type, timestamp, data, webhook id) each.
        self.write_rows = write_rows
        self.name = consumer_name()
        # Its own connection: XREADGROUP blocks it, which presence's fail-fast client must never.
        self.clustered = bool(settings.RELAY_PRESENCE_CLUSTER_NODES)
        if self.clustered:
            self.client = cluster_client(
                settings.RELAY_PRESENCE_CLUSTER_NODES,
                timeout=BLOCK_MS / 1000 + 5,
                retry=AsyncRetry(NoBackoff(), 1),
                **redis_clients.cluster_options(settings.RELAY_PRESENCE_REDIS_URL),
            )
        else:
            self.client = redis_clients.async_client(
                settings.RELAY_PRESENCE_REDIS_URL,
                retry=AsyncRetry(NoBackoff(), 0),
                socket_connect_timeout=1.0,
                socket_timeout=BLOCK_MS / 1000 + 5,
                health_check_interval=0,
            )
        self._occupancy = self.client.register_script(OCCUPANCY)
        self._read = self.client.register_script(READ)
        self._grouped = False

    async def ensure_groups(self) -> None:
        """Create the group on every stream (MKSTREAM); a group that exists is left as it is.

        On a cluster, also load the consumer's scripts on every master: a cluster's pipeline does not
        load them first as a single Redis's does, and a promoted replica has none (a failure of
        the consumer comes back here).
        """
        if self.clustered:
            for script in (self._read, self._occupancy):
                await self.client.script_load(script.script)
        pipe = self.client.pipeline(transaction=False)
        for key in STREAMS:
            pipe.xgroup_create(key, GROUP, id="0", mkstream=True)
        for reply in await pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
                raise reply
        self._grouped = True

    async def read_once(self) -> int:
        """Read new entries (blocking up to BLOCK_MS) and handle them; return how many."""
        if not self._grouped:
            await self.ensure_groups()
        try:
            if self.clustered:
                reply = await self._read_each()
            else:
                reply = await self.client.xreadgroup(
                    GROUP, self.name, {key: ">" for key in STREAMS}, count=READ_COUNT, block=BLOCK_MS
                )
        except redis.ResponseError as error:
            if "NOGROUP" in str(error):
                # Redis lost its data (a restart): the groups go with the streams.
                self._grouped = False
                return 0
            raise
        entries = [(_text(key), _text(entry_id), fields) for key, items in reply or [] for entry_id, fields in items]
        await self.handle(entries)
        return len(entries)

    async def _read_each(self) -> list:
        """One READ per stream, pipelined; the streams that had entries, as XREADGROUP answers.

        Waits POLL_SECONDS when none had any (the cluster's stand-in for BLOCK).
        """
        pipe = self.client.pipeline(transaction=False)
        for key in STREAMS:
            queue_script(pipe, self._read.sha, [key], [GROUP, self.name, READ_COUNT])
        found = []
        for reply in await pipe.execute():
            for key, items in reply or []:
                # A script's reply is raw: the fields come as a flat list.
                entries = [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in items]
                found.append((key, entries))
        if not found:
            await asyncio.sleep(POLL_SECONDS)
        return found

    async def claim_once(self) -> int:
        """Take over entries another consumer read and left unacknowledged too long; handle them."""
        if not self._grouped:
            await self.ensure_groups()
        idle = settings.RELAY_WEBHOOK_CLAIM_MS
        pipe = self.client.pipeline(transaction=False)
        for key in STREAMS:
            pipe.xautoclaim(key, GROUP, self.name, min_idle_time=idle, start_id="0-0", count=READ_COUNT)
        entries = []
        for key, reply in zip(STREAMS, await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):
                if "NOGROUP" in str(reply):
                    self._grouped = False
                    continue
                raise reply
            entries += [(key, _text(entry_id), fields) for entry_id, fields in reply[1] if fields]
        await self.handle(entries)
        return len(entries)

    async def handle(self, entries: Sequence[tuple[str, str, dict]]) -> None:
        """Derive the channel events, write every event's rows, then acknowledge and delete the entries."""
        if not entries:
            return
        started = time.perf_counter()
        rows = []
        signals = []
        occupancy = []
        for key, entry_id, raw in entries:
            fields = {_text(name): _text(value) for name, value in raw.items()}
            event = self._user_event(key, entry_id, fields)
            if event is None:
                continue
            rows.append(event)
            environment_id, event_type, timestamp, data, webhook_id = event
            ms, _, seq = entry_id.partition("-")
            state = "1" if event_type == events.USER_ONLINE else "0"
            for channel_id in filter(None, fields.get("c", "").split(",")):
                occupancy.append((environment_id, channel_id, webhook_id, timestamp, state, ms, seq, data["user"]))
        if occupancy:
            pipe = self.client.pipeline(transaction=False)
            for _, channel_id, _, _, state, ms, seq, user_id in occupancy:
                keys, args = [occupancy_key(channel_id)], [user_id, state, ms, seq]
                if self.clustered:
                    # Loaded on every master by ensure_groups; a NOSCRIPT brings the consumer back there.
                    queue_script(pipe, self._occupancy.sha, keys, args)
                else:
                    # Through the pipeline, redis-py loads the script first when Redis lost it.
                    await self._occupancy(keys=keys, args=args, client=pipe)
            decided = await pipe.execute()
            for (environment_id, channel_id, webhook_id, timestamp, state, _, _, _), made in zip(
                occupancy, decided, strict=True
            ):
                if int(made):
                    event_type = events.CHANNEL_OCCUPIED if state == "1" else events.CHANNEL_VACATED
                    data = {"channel": channel_id}
                    derived = events.derived_webhook_id(webhook_id, channel_id)
                    rows.append((environment_id, event_type, timestamp, data, derived))
                    signals.append((environment_id, event_type, data, derived))
        await self.write_rows(rows)
        pipe = self.client.pipeline(transaction=False)
        for key, entry_id, _ in entries:
            pipe.xack(key, GROUP, entry_id)
            pipe.xdel(key, entry_id)
        await pipe.execute()
        for signal in signals:
            events.send_signal(*signal)
        metrics.STREAM_EVENTS.inc(len(entries))
        metrics.STREAM_SECONDS.observe(time.perf_counter() - started)

    @staticmethod
    def _user_event(key: str, entry_id: str, fields: dict[str, str]) -> tuple | None:
        event_type = fields.get("t")
        environment_id = fields.get("e", "")
        user_id = fields.get("u", "")
        if event_type not in (events.USER_ONLINE, events.USER_OFFLINE) or not environment_id or not user_id:
            log_event(logger, Event.WEBHOOK_INVALID_ENTRY, logging.ERROR, stream=key, entry=entry_id)
            return None
        timestamp = events.iso_ms(int(entry_id.partition("-")[0]))
        data: dict = {"user": user_id}
        if event_type == events.USER_OFFLINE:
            last_seen = fields.get("l")
            data["last_seen_at"] = events.iso_ms(int(last_seen)) if last_seen else timestamp
        bucket = key[len(STREAM_PREFIX) :].strip("{}")
        return environment_id, event_type, timestamp, data, f"msg_{bucket}_{entry_id}"

    async def close(self) -> None:
        await self.client.aclose()


async def run_consumer(consumer: Consumer, stopping: asyncio.Event) -> None:
    """Read and claim until `stopping` is set; a failure is logged and retried a second later."""
    next_claim = 0.0
    while not stopping.is_set():
        try:
            await consumer.read_once()
            if time.monotonic() >= next_claim:
                every = min(max(settings.RELAY_WEBHOOK_CLAIM_MS / 2000, CLAIM_EVERY_MIN_S), CLAIM_EVERY_MAX_S)
                next_claim = time.monotonic() + every
                await consumer.claim_once()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log_event(logger, Event.WEBHOOK_STREAM_FAILED, logging.ERROR, error=type(error).__name__)
            consumer._grouped = False
            await asyncio.sleep(1.0)
