"""Presence fan-out in one task per process: a transition is handled once, not once per watcher.

Through a channel layer, every local watcher of a channel would get its own copy of a transition
on its queue, and each copy would wake that watcher's consumer: a task switch, a dispatch and the
layer's bookkeeping per frame, most of a frame's CPU. The process claims the presence groups
instead (`claim_groups`): each transition comes here once with the group's local members, is
validated once, and is written to each member's socket by one task.

Order per connection is what the queue gave, because a transition goes past a watcher's queue
only when nothing is queued for it nor still being handled (`backlog`): a connection that is
not yet live (its snapshot unsent), or has an earlier transition or a membership change still
in its queue, gets the copy queued behind them. Transitions are taken in the order
they were read, and Daphne's `send` hands the frame to Twisted without waiting, so one slow
client only grows its own socket buffer.
"""

import asyncio
import bisect
import collections
import functools
import logging
import math
import sys
import time
import weakref
from collections.abc import Callable, Collection, Iterable

from channels.db import database_sync_to_async
from django.conf import settings

from presence import actions
from presence.fabric import GROUP_PREFIX, Dedup, StatusChange, Transition, parse_fabric, subject_of
from presence.queries import large_channel_ids
from relay import metrics
from relay.clock import LoopClock, Periodic
from relay.frames import PresenceChanged, PresenceOccupancy, PresenceStatus
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.loops import PerLoop
from relay.registry import Connection

logger = logging.getLogger("presence")

# The copies of one group message reach every local member within milliseconds.
INVALID_COPY_WINDOW_SECONDS = 1.0
INVALID_SEEN_MAX = 256
# For how many refresh intervals a process remembers the ids of the single-copy transitions it
# heard: a publisher sends a copy within two of the first (`PresenceService._copy_around_loss`).
HEARD_SINGLES_INTERVALS = 3
# A large channel's occupancy goes out at most once a second (docs/contract.md, Large rooms).
OCCUPANCY_INTERVAL_SECONDS = 1.0
# A count read right after a transition could miss the set's update that follows the decision
# (an `offline`'s removal is a second round trip): the first read waits this long.
OCCUPANCY_SETTLE_SECONDS = 0.2

# Not in the thread every other database call shares, like the grace check's read.
read_large_channel_ids = database_sync_to_async(large_channel_ids, thread_sensitive=False)

# The longest presence writes in one turn of the loop before it lets the loop's other work run.
FANOUT_SLICE_SECONDS = 0.05

# Where a connection keeps its `Dedup`, set when it is admitted.
STATE_KEY = "presence"
# Where a connection whose snapshot awaits a repair keeps who it was told is online (the
# snapshot, then every change: a `View`), so the repair tells it only what it lacks.
VIEW_KEY = "presence.view"
# Where a connection keeps the messages of its presence groups from joining them until it is live.
HELD_KEY = "presence.held"
# When (monotonic s) a connection began joining its presence groups.
JOINED_AT_KEY = "presence.joined_at"


class View:
    """Who a connection was told is online: its snapshot, then every change since.

    Kept while a repair may be owed, which just after Redis lost its data (or in a fresh one) is
    every connection an instance holds, in rooms of any size: the snapshot is a sorted tuple of
    interned ids, shared by every view that names them, and the changes a dict made at the first
    one, rather than a set of each connection's own copies of the ids.
    """

    __slots__ = ("_changes", "_snapshot")

    def __init__(self, snapshot: Iterable[str]) -> None:
        self._snapshot = tuple(sorted(map(sys.intern, snapshot)))
        self._changes: dict[str, bool] | None = None

    def add(self, user_id: str) -> None:
        """Told `user_id` is online."""
        self._changed(user_id, True)

    def discard(self, user_id: str) -> None:
        """Told `user_id` is offline."""
        self._changed(user_id, False)

    def _changed(self, user_id: str, online: bool) -> None:
        if self._changes is None:
            self._changes = {}
        self._changes[user_id] = online

    def __contains__(self, user_id: object) -> bool:
        if self._changes is not None and user_id in self._changes:
            return self._changes[user_id]
        at = bisect.bisect_left(self._snapshot, user_id)
        return at < len(self._snapshot) and self._snapshot[at] == user_id


async def deliver(conn: Connection, message: dict, parsed: Callable[[], Transition | StatusChange | None]) -> None:
    """Deliver one transition (`message`; `parsed()` validates it) to a connection at most once, as `{user, state}`.

    A status change goes the same way, as `presence.status`.
    """
    dedup: Dedup | None = conn.state.get(STATE_KEY)
    if dedup is None:
        return
    transition = parsed()
    if transition is None:
        # Validated on receipt although the fabric is inside the trust boundary: a malformed
        # payload must never reach a client.
        if fanout().first_sight_of_invalid(message):
            metrics.PRESENCE_INVALID_PAYLOADS.inc()
            log_event(logger, Event.PRESENCE_INVALID_PAYLOAD, logging.ERROR, subject=subject_of(message))
        return
    if isinstance(transition, StatusChange):
        await _deliver_status(conn, transition, dedup)
        return
    if transition.channel in fanout().large:
        return  # counted, not told: the fan-out sends the channel's occupancy
    # A copy queued before a membership removal must not slip through after it.
    if transition.channel not in conn.channel_ids:
        return
    if transition.audience is not None and conn.user_id not in transition.audience:
        return
    if transition.skip is not None and transition.skip == conn.user_id:
        return
    if transition.again and conn.state.get(JOINED_AT_KEY, -math.inf) > channel_layer().back_at():
        # A copy sent once more after a pub/sub loss is for those who were there then: one that
        # joined once this process was whole again heard the first, or read what it said.
        return
    if not transition.single and not dedup.claim(transition.transition):
        metrics.PRESENCE_DEDUP_DROPS.inc()
        return
    if (view := conn.state.get(VIEW_KEY)) is not None:
        (view.add if transition.state == "online" else view.discard)(transition.user)
    await conn.send_frame("presence.changed", PresenceChanged(user=transition.user, state=transition.state))


async def _deliver_status(conn: Connection, change: StatusChange, dedup: Dedup) -> None:
    own = change.user == conn.user_id
    if own:
        # The user's own connections take the copy of the user's group, the one with `invisible`.
        if change.channel is not None:
            return
        # Set on another instance, maybe: this one stops (or starts) counting them in their channels.
        actions.service().heard_visibility(conn.environment_id, conn.user_id, change.invisible)
    elif change.channel is None or change.channel not in conn.channel_ids:
        return
    elif not change.single and not dedup.claim(change.change):
        metrics.PRESENCE_DEDUP_DROPS.inc()
        return
    frame = PresenceStatus(
        user=change.user,
        status=change.status,
        text=change.text,
        emoji=change.emoji,
        until=change.until or None,
        idle=change.idle,
    )
    if own:
        frame["invisible"] = change.invisible
    await conn.send_frame("presence.status", frame)


class Fanout:
    """This event loop's presence deliveries: the claim on the groups, the live watchers, the task."""

    def __init__(self) -> None:
        self.layer = channel_layer()
        # By channel name; weak, so a consumer that ended without its close hook is not kept.
        self.watchers: weakref.WeakValueDictionary[str, Connection] = weakref.WeakValueDictionary()
        # Connections between joining their groups and their snapshot, by channel name, likewise.
        self.joining: weakref.WeakValueDictionary[str, Connection] = weakref.WeakValueDictionary()
        # When presence began writing in this turn of the loop (None: not yet).
        self._slice_began: float | None = None
        self.pending: asyncio.Queue[tuple[dict, tuple[str, ...]]] = asyncio.Queue()
        self.claimed = False
        self._task: asyncio.Task | None = None
        self._invalid_seen: dict[int, float] = {}
        # The ids of the single-copy transitions heard lately, oldest first, with when (monotonic s).
        self._singles: dict[str, float] = {}
        # The large channels of this instance's connections: their transitions become counts.
        self.large: set[str] = set()
        self._occupancy_due: dict[str, asyncio.TimerHandle] = {}
        self._occupancy_sent_at: dict[str, float] = {}
        self._occupancy_sent: dict[str, int] = {}
        self.rechecks = Periodic(
            self.recheck,
            interval=lambda: settings.RELAY_PRESENCE_REFRESH_MS / 1000,
            # The loop's own time: a test's manual presence clock drives grace checks, not this.
            clock=LoopClock,
            failed=self._recheck_failed,
            wanted=lambda: bool(self.watchers),
        )

    def join(self, conn: Connection) -> None:
        """`conn` is joining its groups: what comes for it is kept, in order, until it is live.

        Kept in a list, not put on the connection's queue: a connect in a burst waits round trips
        between its groups and its snapshot, and through the queue each of the many transitions
        meanwhile cost a serialization, a wake-up and a dispatch.
        """
        conn.state[HELD_KEY] = collections.deque()
        conn.state[JOINED_AT_KEY] = time.monotonic()
        self.joining[conn.channel_name] = conn

    async def live(self, conn: Connection) -> None:
        """`conn` has its snapshot: what was kept for it goes out, then transitions are written to it directly."""
        if not self.claimed:
            self.layer.claim_groups(GROUP_PREFIX, self.received)
            self.claimed = True
        held: collections.deque | None = conn.state.get(HELD_KEY)
        # What arrives while these are written is appended, and written in its turn.
        while held:
            await self._write(conn, *held.popleft())
            await self._pace()
        if held is not None and conn.state.get(HELD_KEY) is not held:
            return  # gone meanwhile
        self.joining.pop(conn.channel_name, None)
        conn.state.pop(HELD_KEY, None)
        self.watchers[conn.channel_name] = conn
        self.rechecks.start()

    def gone(self, conn: Connection) -> None:
        """`conn` is closing: nothing more is written to it from here."""
        self.watchers.pop(conn.channel_name, None)
        self.joining.pop(conn.channel_name, None)
        conn.state.pop(HELD_KEY, None)

    def received(self, message: dict, members: tuple[str, ...]) -> None:
        """One transition read off Redis, with the channels that were in its group at that moment."""
        self.pending.put_nowait((message, members))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._deliver_forever())

    def first_sight_of_invalid(self, message: dict) -> bool:
        """True for the first local copy of a malformed fabric message, False for the others.

        Every local member of a group receives its own copy of a message, so without this one
        bad publish to a busy channel would log once per connection instead of once.
        """
        now = time.monotonic()
        fingerprint = hash(repr(message))
        if self._invalid_seen.get(fingerprint, 0) > now:
            return False
        if len(self._invalid_seen) >= INVALID_SEEN_MAX:
            self._invalid_seen = {key: until for key, until in self._invalid_seen.items() if until > now}
        self._invalid_seen[fingerprint] = now + INVALID_COPY_WINDOW_SECONDS
        return True

    async def _deliver_forever(self) -> None:
        while True:
            message, members = await self.pending.get()
            await self.deliver(message, members)
            await self._pace()

    async def _pace(self) -> None:
        """Let the loop's other work run once presence has written for a slice of this turn of the loop.

        Neither a queue holding more nor a write suspends: without this, a burst's fan-out (and
        the connects' kept messages) held the loop for seconds, and the handshakes and Redis
        replies waiting behind it passed their timeouts. One slice per turn for every writer
        (the fan-out and each connect's kept messages) together; not a yield after every write,
        so each socket's frames of a slice go out in one write.
        """
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self._slice_began is None:
                # The first write of this turn: the next turn begins a new slice.
                self._slice_began = now
                loop.call_soon(self._next_turn)
            if now - self._slice_began < FANOUT_SLICE_SECONDS:
                return
            await asyncio.sleep(0)

    def _next_turn(self) -> None:
        self._slice_began = None

    async def deliver(self, message: dict, members: tuple[str, ...]) -> None:
        """Write one transition to each member, or queue it behind what the member has queued."""
        if not self._first_single(message):
            metrics.PRESENCE_DEDUP_DROPS.inc()
            return
        # Validated once, when a member first needs it.
        transition = functools.cache(functools.partial(parse_fabric, message))
        if self.large and isinstance(parsed := transition(), Transition) and parsed.channel in self.large:
            # O(1) per transition whatever the channel's size: a count, sent at most once a second.
            self.occupancy_changed(parsed.channel)
            return
        for channel in members:
            conn = self.watchers.get(channel)
            if conn is not None:
                await self._write(conn, message, transition)
            elif (joining := self.joining.get(channel)) is not None:
                joining.state[HELD_KEY].append((message, transition))
            else:
                self.layer.send_local(channel, message)

    def _first_single(self, message: dict) -> bool:
        """False for a copy sent again of a single-copy transition this process heard the first time.

        A connection remembers no id of a single-copy transition (`Transition.copies`), so its
        copy would be told twice; the process remembers them for a few refresh intervals instead,
        once for all its watchers. Read off the raw message: validated later, when delivered.
        """
        transition_id = message.get("transition")
        if message.get("copies") != 1 or not isinstance(transition_id, str):
            return True
        if message.get("again") is True and transition_id in self._singles:
            return False
        now = time.monotonic()
        since = now - HEARD_SINGLES_INTERVALS * settings.RELAY_PRESENCE_REFRESH_MS / 1000
        while self._singles:
            oldest, heard_at = next(iter(self._singles.items()))
            if heard_at >= since:
                break
            del self._singles[oldest]
        self._singles[transition_id] = now
        return True

    async def _write(self, conn: Connection, message: dict, transition: Callable) -> None:
        """Write to `conn` now, or queue behind what its consumer has queued (order is kept)."""
        if self.layer.backlog(conn.channel_name):
            self.layer.send_local(conn.channel_name, message)
            return
        try:
            await deliver(conn, message, transition)
        except Exception as error:
            # One connection's failure must not cost the other watchers their frame. The type
            # only: a write's error may quote the frame it could not send.
            metrics.PRESENCE_FAILURES.labels(op="deliver").inc()
            log_event(logger, Event.PRESENCE_FAILED, logging.ERROR, op="deliver", error=type(error).__name__)

    # ── large channels: occupancy instead of people ──────────────────────────
    def modes(self, channel_ids: Collection[str], large: Collection[str]) -> None:
        """What a connect's database hop found of its channels: which are large now."""
        self.large.difference_update(set(channel_ids) - set(large))
        self.large.update(large)

    def occupancy_changed(self, channel_id: str) -> None:
        """A transition in a large channel: send its count, at most once a second, the last one always."""
        if channel_id in self._occupancy_due:
            return  # the pending send reads the count when it goes
        wait = self._occupancy_sent_at.get(channel_id, 0.0) + OCCUPANCY_INTERVAL_SECONDS - time.monotonic()
        loop = asyncio.get_running_loop()
        self._occupancy_due[channel_id] = loop.call_later(
            max(wait, OCCUPANCY_SETTLE_SECONDS), lambda: asyncio.ensure_future(self._send_occupancy([channel_id]))
        )

    async def _send_occupancy(self, channel_ids: list[str], always: bool = False) -> None:
        for channel_id in channel_ids:
            self._occupancy_due.pop(channel_id, None)
            self._occupancy_sent_at[channel_id] = time.monotonic()
        counts = await actions.service().store.occupancy(channel_ids)
        if counts is None:
            return  # logged by the store; the next recheck sends it
        for channel_id, count in counts.items():
            if not always and self._occupancy_sent.get(channel_id) == count:
                continue
            self._occupancy_sent[channel_id] = count
            frame = PresenceOccupancy(channel=channel_id, online=count)
            await self._to_watchers(channel_id, "presence.occupancy", [frame])

    async def _to_watchers(self, channel_id: str, frame_type: str, payloads: list) -> None:
        for conn in list(self.watchers.values()):
            if channel_id not in conn.channel_ids:
                continue
            try:
                for payload in payloads:
                    await conn.send_frame(frame_type, payload)
            except Exception as error:
                metrics.PRESENCE_FAILURES.labels(op="deliver").inc()
                log_event(logger, Event.PRESENCE_FAILED, logging.ERROR, op="deliver", error=type(error).__name__)

    def _recheck_failed(self, error: Exception) -> None:
        metrics.PRESENCE_FAILURES.labels(op="recheck").inc()
        log_event(logger, Event.PRESENCE_FAILED, logging.ERROR, op="recheck", error=type(error).__name__)

    async def recheck(self) -> None:
        """Once a refresh interval: switch channels that crossed the threshold, and resend changed counts.

        A channel that became large gets its count; one that became small gets the end of its
        count (`"large": false`), then an `online` per member online now (the watchers knew only
        the count). Counts are sent again when they changed without a transition this instance
        heard (an entry expiring after a crash).
        """
        local = {channel_id for conn in list(self.watchers.values()) for channel_id in conn.channel_ids}
        if not local:
            return
        large = await read_large_channel_ids(local)
        now_small = (self.large & local) - large
        now_large = large - self.large
        self.large = (self.large - local) | large
        store = actions.service().store
        for channel_id in sorted(now_small):
            members = await store.channel_members(channel_id)
            if members is None:
                # Logged by the store: counted until a recheck can name its people.
                self.large.add(channel_id)
                continue
            self._occupancy_sent.pop(channel_id, None)
            watcher = next((c for c in self.watchers.values() if channel_id in c.channel_ids), None)
            if watcher is None:
                continue  # its watchers left meanwhile
            # Not whoever was said `offline` and is still in the set until its decider takes them out.
            online = sorted(set(members) - await store.said_offline(watcher.environment_id, members))
            ended = PresenceOccupancy(channel=channel_id, online=len(online), large=False)
            await self._to_watchers(channel_id, "presence.occupancy", [ended])
            frames = [PresenceChanged(user=user_id, state="online") for user_id in online]
            await self._to_watchers(channel_id, "presence.changed", frames)
        if now_large:
            await self._send_occupancy(sorted(now_large), always=True)
        if steady := sorted(large - now_large):
            await self._send_occupancy(steady)


# The presence fan-out of the running event loop.
fanout = PerLoop(Fanout)
