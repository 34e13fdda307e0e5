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
import functools
import logging
import time
import weakref
from collections.abc import Callable

from presence.fabric import GROUP_PREFIX, Dedup, StatusChange, Transition, parse_fabric, subject_of
from relay import metrics
from relay.frames import PresenceChanged, PresenceStatus
from relay.layer import channel_layer
from relay.logging import log_event
from relay.loops import PerLoop
from relay.registry import Connection

logger = logging.getLogger("presence")

# The copies of one group message reach every local member within milliseconds.
INVALID_COPY_WINDOW_SECONDS = 1.0
INVALID_SEEN_MAX = 256

# Where a connection keeps its `Dedup`, set when it is admitted.
STATE_KEY = "presence"


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
            log_event(logger, "presence.invalid_payload", logging.ERROR, subject=subject_of(message))
        return
    if isinstance(transition, StatusChange):
        await _deliver_status(conn, transition, dedup)
        return
    # A copy queued before a membership removal must not slip through after it.
    if transition.channel not in conn.channel_ids:
        return
    if transition.audience is not None and conn.user_id not in transition.audience:
        return
    if transition.skip is not None and transition.skip == conn.user_id:
        return
    if not transition.single and not dedup.claim(transition.transition):
        metrics.PRESENCE_DEDUP_DROPS.inc()
        return
    await conn.send_frame("presence.changed", PresenceChanged(user=transition.user, state=transition.state))


async def _deliver_status(conn: Connection, change: StatusChange, dedup: Dedup) -> None:
    own = change.user == conn.user_id
    if own:
        # The user's own connections take the copy of the user's group, the one with `invisible`.
        if change.channel is not None:
            return
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
        self.pending: asyncio.Queue[tuple[dict, tuple[str, ...]]] = asyncio.Queue()
        self.claimed = False
        self._task: asyncio.Task | None = None
        self._invalid_seen: dict[int, float] = {}

    def live(self, conn: Connection) -> None:
        """`conn` has its snapshot: transitions may be written to it directly from now on."""
        if not self.claimed:
            self.layer.claim_groups(GROUP_PREFIX, self.received)
            self.claimed = True
        self.watchers[conn.channel_name] = conn

    def gone(self, conn: Connection) -> None:
        """`conn` is closing: nothing more is written to it from here."""
        self.watchers.pop(conn.channel_name, None)

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

    async def deliver(self, message: dict, members: tuple[str, ...]) -> None:
        """Write one transition to each member, or queue it behind what the member has queued."""
        # Validated once, when a member first needs it.
        transition = functools.cache(functools.partial(parse_fabric, message))
        for channel in members:
            conn = self.watchers.get(channel)
            if conn is None or self.layer.backlog(channel):
                self.layer.send_local(channel, message)
                continue
            try:
                await deliver(conn, message, transition)
            except Exception as error:
                # One connection's failure must not cost the other watchers their frame. The type
                # only: a write's error may quote the frame it could not send.
                metrics.PRESENCE_FAILURES.labels(op="deliver").inc()
                log_event(logger, "presence.failed", logging.ERROR, op="deliver", error=type(error).__name__)


# The presence fan-out of the running event loop.
fanout = PerLoop(Fanout)
