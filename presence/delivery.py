"""Presence fan-out in one task per process: a transition is handled once, not once per watcher.

Through the channel layer, every local watcher of a channel gets its own copy of a transition on
its queue, and each copy wakes that watcher's consumer: a task switch, a dispatch and the
layer's bookkeeping per frame, most of a frame's CPU. On Relay's pub/sub layer the process
claims the presence groups instead (`claim_groups`): each transition comes here once with the
group's local members, is validated once, and is written to each member's socket by one task.

Order per connection is what the queue gave, because a transition goes past a watcher's queue
only when nothing is queued for it nor still being handled (`backlog`): a connection that is
not yet live (its snapshot unsent), or has an earlier transition or a membership change still
in its queue, gets the copy queued behind them, as before. Transitions are taken in the order
they were read, and Daphne's `send` hands the frame to Twisted without waiting, so one slow
client only grows its own socket buffer.
"""

import asyncio
import functools
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from channels.layers import get_channel_layer

from presence import actions
from presence.fabric import GROUP_PREFIX, Dedup, Transition, parse_transition, subject_of
from relay import metrics
from relay.logging import log_event

if TYPE_CHECKING:
    from relay.consumers import GatewayConsumer

logger = logging.getLogger("presence")

# Where a connection keeps its `Dedup`, set when it is admitted.
STATE_KEY = "presence"


async def deliver(conn: "GatewayConsumer", message: dict, parsed: Callable[[], Transition | None]) -> None:
    """Deliver one transition (`message`; `parsed()` validates it) to a connection at most once, as `{user, state}`."""
    dedup: Dedup | None = conn.state.get(STATE_KEY)
    if dedup is None:
        return
    # A copy of the `online` this connection sent itself is dropped whatever it holds: nothing of
    # it reaches the client, and the id it is matched on was minted here.
    if dedup.drop_sent_ahead(message.get("transition")):
        metrics.PRESENCE_DEDUP_DROPS.inc()
        return
    transition = parsed()
    if transition is None:
        # Validated on receipt although the fabric is inside the trust boundary: a malformed
        # payload must never reach a client.
        if actions.service().first_sight_of_invalid(message):
            metrics.PRESENCE_INVALID_PAYLOADS.inc()
            log_event(logger, "presence.invalid_payload", logging.ERROR, subject=subject_of(message))
        return
    # A copy queued before a membership removal must not slip through after it.
    if transition.channel not in conn.channel_ids:
        return
    if transition.audience is not None and conn.user_id not in transition.audience:
        return
    if not transition.single and not dedup.claim(transition.transition):
        metrics.PRESENCE_DEDUP_DROPS.inc()
        return
    await conn.send_frame("presence.changed", {"user": transition.user, "state": transition.state})


class Fanout:
    """This event loop's presence deliveries: the claim on the groups, the live watchers, the task."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        # By channel name; weak, so a consumer that ended without its close hook is not kept.
        self.watchers: weakref.WeakValueDictionary[str, GatewayConsumer] = weakref.WeakValueDictionary()
        self.pending: asyncio.Queue[tuple[dict, tuple[str, ...]]] = asyncio.Queue()
        # The `online`s this loop's connections deliver to themselves, by transition id: the
        # connection's channel name and its Dedup, which counts the copies still to come.
        self.own: dict[str, tuple[str, Dedup]] = {}
        self.claimed = False
        self._task: asyncio.Task | None = None

    def claim(self) -> bool:
        """Claim the presence groups on this loop's layer once; False on a layer that cannot."""
        if not self.claimed:
            claim_groups = getattr(self.layer, "claim_groups", None)
            if claim_groups is None:
                return False
            claim_groups(GROUP_PREFIX, self.received)
            self.claimed = True
        return True

    def live(self, conn: "GatewayConsumer") -> None:
        """`conn` has its snapshot: transitions may be written to it directly from now on."""
        if self.claim():
            self.watchers[conn.channel_name] = conn

    def gone(self, conn: "GatewayConsumer") -> None:
        """`conn` is closing: nothing more is written to it from here."""
        self.watchers.pop(conn.channel_name, None)
        dedup: Dedup | None = conn.state.get(STATE_KEY)
        if dedup is not None:
            # Copies still to come go to no one now.
            self.withdraw_own(dedup)

    def expect_own(self, conn: "GatewayConsumer", dedup: Dedup) -> None:
        """`conn` delivers the transition `dedup` sent ahead to itself: drop its copies as they are read.

        Said before the election that may publish it. The copies come back to this process while
        the connection is still being admitted (Redis writes them before the election's reply),
        and then went to the connection's queue, re-serialized, to be dropped by its consumer
        after the connect: every first connect paid for that. `withdraw_own` undoes it.
        """
        if dedup.ahead is not None and self.claim():
            self.own[dedup.ahead] = (conn.channel_name, dedup)

    def withdraw_own(self, dedup: Dedup) -> None:
        """Forget what `expect_own` said, in both places: no copies are to be dropped for this connection.

        Its election published nothing, or it is closing.
        """
        if dedup.ahead is not None:
            self.own.pop(dedup.ahead, None)
        dedup.withdraw()

    def received(self, message: dict, members: tuple[str, ...]) -> None:
        """One transition read off Redis, with the channels that were in its group at that moment."""
        transition_id = message.get("transition") if isinstance(message, dict) else None
        own = self.own.get(transition_id) if isinstance(transition_id, str) else None
        if own is not None:
            members = self._without_own_copy(transition_id, members, *own)
            if not members:
                return
        self.pending.put_nowait((message, members))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._deliver_forever())

    def _without_own_copy(
        self, transition_id: str, members: tuple[str, ...], channel: str, dedup: Dedup
    ) -> tuple[str, ...]:
        if channel not in members or not dedup.drop_sent_ahead(transition_id):
            return members
        metrics.PRESENCE_DEDUP_DROPS.inc()
        if dedup.ahead is None:
            # Its last copy.
            del self.own[transition_id]
        return tuple(member for member in members if member != channel)

    async def _deliver_forever(self) -> None:
        while True:
            message, members = await self.pending.get()
            await self.deliver(message, members)

    async def deliver(self, message: dict, members: tuple[str, ...]) -> None:
        """Write one transition to each member, or queue it behind what the member has queued."""
        # Validated once, when a member first needs it: a connection's own `online` coming back to
        # it alone (what every first connect of a user publishes) is dropped without it.
        transition = functools.cache(functools.partial(parse_transition, message))
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


_fanouts: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Fanout]" = weakref.WeakKeyDictionary()


def fanout() -> Fanout:
    """The presence fan-out of the running event loop (Daphne runs one; each in-process test its own)."""
    loop = asyncio.get_running_loop()
    found = _fanouts.get(loop)
    if found is None:
        found = _fanouts[loop] = Fanout()
    return found
