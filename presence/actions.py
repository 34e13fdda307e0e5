"""Presence writes: admit (limit + election), close (re-pin + grace check), refresh, reap, publish.

One `PresenceService` per event loop holds this instance's view, always keyed by
(environment id, user id) and never by the user id alone: the connections of each held user,
ONE pending grace check per user (replaced, never added), and the one task that refreshes and
reaps every RELAY_PRESENCE_REFRESH_MS while the instance holds anybody. Which instance is
"first" or "last" anywhere is Redis's question (presence/scripts.py); this module only knows
its own connections.
"""

import asyncio
import collections
import functools
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

from channels.db import database_sync_to_async
from django.conf import settings

from presence.fabric import GROUP_PREFIX, State, group_name, transition_message
from presence.queries import (
    channel_ids_of_member,
    channel_ids_of_members,
    is_invisible,
    mark_last_seen,
    members_seeing_only,
)
from presence.scripts import member, split_member
from presence.store import REAP_BATCH, Election, PresenceStore, Timings, record_failure
from relay import close_codes, metrics
from relay.clock import Clock, LoopClock, Periodic, Timer
from relay.exceptions import ConnectionRefused
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.loops import PerLoop
from relay.registry import Connection
from webhooks import events as webhook_events

logger = logging.getLogger("presence")


ALREADY_ONLINE = "already online"
STILL_OPEN = "a connection is still open somewhere"
ANOTHER_PUBLISHED = "another instance published it"
NEVER_RETRACTED = "its last online was never retracted (the instance that held it died)"
VANISHED = "key vanished under a live connection; re-electing"
EPOCH_CHANGED = "redis lost its data since the close; asking again after a refresh"
SETTLING = "redis lost its data moments ago; asking again once every holder re-elected its users"
RECOVERING = "redis did not answer moments ago; asking again once every holder re-elected its users"
SUPERSEDED = "its publish failed and the user's state has changed since"

Subject = tuple[str, str]

# How many of Redis's latest losses `lost_before` remembers: a read is checked within
# `Timings.rejoin` and an interval of it, and Redis does not restart that often.
LOSSES_KEPT = 8

# Presence's one source of time on this instance (relay/clock.py); tests replace it.
clock: Clock = LoopClock()


def _unheard(election: Election, channels: Iterable[str]) -> frozenset[str]:
    """The channels whose members may not have heard the `online` an unretracted election took over.

    Those added since the holder that published it last wrote the user's channels: an addition
    made while the key was gone (after a close's grace, before its check) found the user offline
    and announced nothing, and this election publishes nothing either. Not known when none were
    kept (Redis lost them): nobody, rather than a second `online` to every channel.
    """
    if not election.unretracted or election.heard is None:
        return frozenset()
    return frozenset(channels) - election.heard


@dataclass
class Held:
    """One user this instance holds connections for.

    `connections` maps each connection id to that connection's `channel_ids`, the very set the
    consumer keeps current on membership changes, so a later transition goes to the channels of
    now, not of the connect. `confirmed` is False while no election has reached Redis for this
    user here (it was down at connect): the refresh then announces them once it can. `admitting`
    holds the connections whose election is still on its way: the refresh leaves them to it.
    """

    connections: dict[str, set[str]] = field(default_factory=dict)
    confirmed: bool = False
    admitting: set[str] = field(default_factory=set)
    # The channel ids last written beside the user's deadline (for the reaper); None: unknown.
    written: frozenset[str] | None = None
    # A close found only connections still being admitted here and so did not re-pin: if none
    # of them is let in (4429), the refusal does the last close's re-pin and grace check.
    close_owed: bool = False
    # Invisible as this instance last knew: their elections (and a re-election after Redis lost
    # the key) announce `online` to their own connections only, and they are counted in no
    # channel's online set. Kept current by the user's own status messages (`heard_visibility`).
    invisible: bool = False

    def admitted(self) -> list[str]:
        """The ids of the connections whose election has been answered."""
        return [connection_id for connection_id in self.connections if connection_id not in self.admitting]

    def channels(self) -> set[str]:
        """The user's channels, as their newest connection knows them."""
        return set(next(reversed(self.connections.values()), set()))


@dataclass(frozen=True)
class Owed:
    """A transition decided here whose publish failed: sent again until it lands or is superseded.

    Or, with `copy_at`, one that went out while Redis was unsteady, sent once more at that time
    (monotonic s) under the same id (`PresenceService._again_if_unsteady`, `_copy_around_loss`).
    """

    state: State
    channels: list[str]
    transition_id: str
    hidden: bool = False
    audience: list[str] | None = None
    copy_at: float | None = None


def _group_sends(
    user_id: str,
    state: State,
    channels: Sequence[str],
    transition_id: str,
    hidden: bool = False,
    audience: list[str] | None = None,
    again: bool = False,
) -> list[tuple[str, dict]]:
    """One transition as a message for the group of each of `channels` (for `audience` alone, if given).

    `hidden`: the user is invisible, so only their own connections hear it (docs/contract.md,
    Rich presence): others were told `offline` when they turned invisible.
    """
    audience = [user_id] if hidden else audience
    return [
        (
            group_name(channel_id),
            transition_message(
                user_id, state, transition_id, channel_id, copies=len(channels), audience=audience, again=again
            ),
        )
        for channel_id in channels
    ]


def _published(environment_id: str, user_id: str, state: State, channels: int, last_seen_ms: int | None = None) -> None:
    metrics.presence_published(state).inc()
    # `channels` is a count: the list would be a membership graph in a log file.
    log_event(logger, Event.PRESENCE_PUBLISHED, user=user_id, state=state, channels=channels)
    webhook_events.send_presence_signal(environment_id, user_id, state, last_seen_ms)


def suppressed(user_id: str, state: State, reason: str) -> None:
    """Log and count a transition this instance decided not to publish."""
    metrics.PRESENCE_SUPPRESSED.labels(state=state, reason=reason).inc()
    log_event(logger, Event.PRESENCE_SUPPRESSED, user=user_id, state=state, reason=reason)


# Not in the thread every other database call shares (thread_sensitive): a write stuck there
# (a message.send behind a locked database) would hold up every `offline` of the instance.
read_channel_ids = database_sync_to_async(channel_ids_of_member, thread_sensitive=False)
read_channel_ids_of_members = database_sync_to_async(channel_ids_of_members, thread_sensitive=False)
read_invisible = database_sync_to_async(is_invisible, thread_sensitive=False)
write_last_seen = database_sync_to_async(mark_last_seen, thread_sensitive=False)
read_members_seeing_only = database_sync_to_async(members_seeing_only, thread_sensitive=False)

# Where a connection keeps whether its user was invisible when it connected (presence/status.py).
INVISIBLE_KEY = "presence.invisible"
# Script calls of the user's bucket that go in the election's round trip, ahead of it.
AHEAD_KEY = "presence.ahead"


class PresenceService:
    """This instance's presence state on one event loop."""

    def __init__(self, timings: Timings | None = None) -> None:
        self.timings = timings or Timings.from_settings()
        self.clock = clock
        self.store = PresenceStore(
            settings.RELAY_PRESENCE_REDIS_URL, self.timings, settings.RELAY_PRESENCE_CLUSTER_NODES
        )
        self.held: dict[Subject, Held] = {}
        self.pending: dict[Subject, Timer] = {}
        self.closed = False
        # Two rounds: a long reaper pass (a dead peer's thousands of users) never delays this
        # instance's own refresh past the TTL. Each stops when the instance holds nobody and owes
        # no publish: every live watcher is held by some instance, and that instance's reaper
        # tells them about a dead peer's users.
        self.refresher = self._every_interval("refresh", self._refresh)
        self.reaper = self._every_interval("reap", self._reap)
        # Per user, the newest transition decided here whose publish failed (a separate presence
        # Redis: the layer's publish comes after the script's decision and can fail on its own).
        self._owed: dict[Subject, Owed] = {}
        # Resolved when the refresh in flight (if any) has been answered by Redis.
        self._refreshing: asyncio.Future | None = None
        self._tasks: set[asyncio.Task] = set()
        # Resolved by the next refresh Redis answers (`next_answer`).
        self._answered: asyncio.Future | None = None
        # Until when (monotonic s) a read may miss users still to be re-elected (`unsettled_for`).
        self._settles_at = 0.0
        # When (monotonic s) the last answered refresh began, and (`lost_before`) the latest times
        # a refresh found this instance's users' keys gone: when the answered one before it began
        # (Redis lost them after that), and when it found them gone. Several: Redis can restart
        # again before the reads of the first loss are checked.
        self._answered_began = -math.inf
        self._losses: collections.deque[tuple[float, float]] = collections.deque(maxlen=LOSSES_KEPT)
        # Whether Redis did not answer the last refresh (or grace check), and when (monotonic s) it
        # next answered this instance (`_recovering_for`).
        self._unanswered = False
        self._back_at = -math.inf
        # What this instance published lately, the newest per user and oldest first, and the
        # layer's loss of a pub/sub connection it last sent copies for (`_copy_around_loss`).
        self._recent: dict[Subject, tuple[float, Owed]] = {}
        self._copied_loss = -math.inf

    # ── connections ──────────────────────────────────────────────────────────
    async def connect(
        self, conn: Connection, watch: Sequence[str], large: Collection[str] = ()
    ) -> tuple[list[str], dict[str, int], int, int, str | None, frozenset[str]] | None:
        """Admit a connection: enforce the limit, run the election, publish `online` if won.

        Returns which of `watch` are online and how many are in each `large` channel, read in
        the same round trip after the election, for how long (ms) that read may still miss
        users whose holders have not re-elected them in a Redis that lost its data (0: it
        cannot), for how long (ms) this instance may yet find that it did (`_young`), the
        epoch of the user's bucket it was read in, and the user's channels whose members may not
        have heard the `online` this connection took over (`_unheard`); None when Redis did not
        answer. Raises ConnectionRefused(4429) when the user already holds the maximum of
        connections anywhere; nothing is changed then. With Redis unreachable the connection is
        admitted (presence must not take sockets down with it) and the refresh announces it later.
        """
        subject = (conn.environment_id, conn.user_id)
        # Registered before the await, so a close of another local connection racing this one
        # does not take this user for gone from this instance.
        held = self.held.setdefault(subject, Held())
        held.connections[conn.connection_id] = conn.channel_ids
        held.invisible = bool(conn.state.get(INVISIBLE_KEY))
        self._ensure_ticker()
        channels = sorted(conn.channel_ids)
        transition_id = str(uuid.uuid4())
        # Prepared whether or not this connection wins: Redis publishes them in the election's own
        # round trip when it does (when the layer's groups live on the presence Redis).
        publish = self._script_publishes("online", conn.user_id, channels, transition_id, held.invisible)
        # A refresh meanwhile must not take this connection for one already elected: landing
        # first, it would re-create a missing key ("vanished") and this election would then find
        # the user online and publish nothing.
        held.admitting.add(conn.connection_id)
        try:
            election = await self.store.elect(
                conn.environment_id,
                conn.user_id,
                conn.connection_id,
                watch,
                publish or (),
                channels,
                large,
                hidden=held.invisible,
                ahead=conn.state.pop(AHEAD_KEY, ()),
            )
        finally:
            held.admitting.discard(conn.connection_id)
        if election is None:
            held.close_owed = False
            return None
        if not election.admitted:
            if self._forget(subject, conn.connection_id) and held.close_owed and not self.closed:
                # The user's last admitted connection here closed while this one was being
                # admitted, and left the re-pin and the grace check to it.
                epoch = await self.store.release(conn.environment_id, conn.user_id, conn.connection_id, last_local=True)
                self._arm_grace_check(subject, epoch)
            raise ConnectionRefused(close_codes.TOO_MANY_CONNECTIONS, "too many connections for this user")
        held.close_owed = False
        held.confirmed = True
        held.written = frozenset(channels)
        if not election.won:
            suppressed(conn.user_id, "online", NEVER_RETRACTED if election.unretracted else ALREADY_ONLINE)
        elif publish is not None:
            self._owed.pop(subject, None)
            _published(conn.environment_id, conn.user_id, "online", len(channels))
            self._sent(subject, Owed("online", channels, transition_id, held.invisible))
        else:
            await self.publish(
                conn.environment_id, conn.user_id, "online", channels, transition_id, hidden=held.invisible
            )
        unsettled = self._unsettled(election)
        young = 0 if unsettled else self._young(election)
        return election.online, election.occupancy, unsettled, young, election.epoch, _unheard(election, channels)

    def _unsettled(self, election: Election) -> int:
        """For how long (ms) the election's snapshot may miss users still to be re-elected.

        While this instance's refresh has lately found its users' keys gone (`unsettled_for`):
        until every live holder's refresh has re-elected its users, a co-member online all along
        can be missing from the channels' online sets, and nothing would ever be published about
        them. A young epoch is no sign by itself: every bucket's first user starts one, so at an
        instance's start (or a reconnect storm into a fresh Redis) most connects would be repaired.
        """
        if election.epoch is None:
            return 0
        return round(self.unsettled_for() * 1000)

    def _young(self, election: Election) -> int:
        """For how long (ms) this instance's refresh may still find that the election read a Redis that lost its data.

        An election in a young epoch may have run after Redis restarted empty and before this
        instance's refresh found its users' keys gone, which it does within `Timings.rejoin` of
        the epoch's start (and one interval more for the refresh in flight then).
        """
        if election.epoch is None:
            return 0
        return max(0, self.timings.rejoin + self.timings.refresh - election.epoch_age_ms)

    def _answered_again(self) -> None:
        self._unanswered = False
        self._back_at = time.monotonic()

    def _recovering_for(self) -> float:
        """Seconds until every live holder has had an answered refresh since Redis answered this instance again.

        A connection let in while Redis did not answer its instance has no key until then, so a
        grace check would take the user for gone. Learnt from this instance's refresh, or from a
        grace check's read when no refresh runs here.
        """
        return max(0.0, self._back_at + self.timings.rejoin / 1000 - time.monotonic())

    def lost_before(self, moment: float) -> bool:
        """Whether Redis may have lost its data before `moment` (monotonic s), found out only after it.

        That is, the last refresh to find this instance's users' keys gone came after `moment`,
        and the refresh answered before it (which found them there) began before `moment`.
        """
        return any(began <= moment <= found for began, found in self._losses)

    def lost_after(self, moment: float) -> bool:
        """Whether Redis may have lost its data (again) after `moment` (monotonic s), as found out since."""
        return any(began > moment for began, _ in self._losses)

    def _settling(self, left_ms: float) -> None:
        self._settles_at = max(self._settles_at, time.monotonic() + left_ms / 1000)

    def unsettled_for(self) -> float:
        """Seconds during which a read of who is online may still miss users Redis lost lately.

        Learnt from this instance's refresh finding its users' keys gone (Redis emptied, or paused
        past the TTL; a young epoch alone is no sign, as the first user of a bucket starts one):
        every live holder has re-elected its users `Timings.rejoin` after that.
        """
        return max(0.0, self._settles_at - time.monotonic())

    async def disconnect(self, conn: Connection) -> None:
        """A connection closed: free its slot and, if it was the user's last here, arm the grace check."""
        if self.closed:
            # The instance is shutting down: `close` frees every slot it holds at once and leaves the
            # keys to expire, so a surviving instance decides each user's `offline`.
            return
        subject = (conn.environment_id, conn.user_id)
        hidden = self.hidden(*subject)
        last_local = self._forget(subject, conn.connection_id)
        held = self.held.get(subject)
        if held is not None and not held.admitted():
            # Only connections still waiting for their election remain: whether this close was
            # the last is theirs to tell (a refused one does the re-pin and the check).
            held.close_owed = True
        refreshing = self._refreshing
        if refreshing is not None:
            # A refresh in flight was built before this close and still carries the connection.
            # Reaching Redis after the release, it would put the slot back and stretch the key to
            # the TTL again: the grace check would find the user online, and their `offline`
            # would wait for the reaper. The release goes once Redis has answered it. (Shielded:
            # a cancelled await would cancel the shared future, under its other waiters too.)
            await asyncio.shield(refreshing)
        # AWAITED before the timer is armed: the re-pin's round trip then sits inside the wait
        # instead of racing the check (docs/presence.md, The races: the margin).
        epoch = await self.store.release(conn.environment_id, conn.user_id, conn.connection_id, last_local=last_local)
        if last_local and not self.closed:
            self._arm_grace_check(subject, epoch)
            # The user's entries in their channels' online sets last until the grace check
            # decides (grace + margin), not only the grace like the key: a snapshot read in
            # between must still show the user, who, back by then, publishes nothing. Also when
            # the release went unanswered (a timeout): its check, without an epoch, is answered
            # "ask again" and decides a refresh interval and a margin later.
            pinned = self.timings.check_delay
            if epoch is None:
                pinned += self.timings.refresh + self.timings.margin
            if not hidden:
                await self.store.channels_seen({c: [conn.user_id] for c in conn.channel_ids}, pinned)
            # Written at the close rather than at the decision: the last close anywhere is the
            # last write, and a watcher that asks right after hearing `offline` finds it.
            self.spawn(self._last_seen([subject], time.time()))

    # ── visibility ───────────────────────────────────────────────────────────
    def hidden(self, environment_id: str, user_id: str) -> bool:
        """Whether a user this instance holds is invisible, as it last knew."""
        held = self.held.get((environment_id, user_id))
        return held is not None and held.invisible

    def heard_visibility(self, environment_id: str, user_id: str, invisible: bool) -> None:
        """A status of a user held here says whether they are invisible (it may have changed elsewhere)."""
        held = self.held.get((environment_id, user_id))
        if held is None or held.invisible == invisible:
            return
        held.invisible = invisible
        self.spawn(self.recount(environment_id, user_id, invisible, sorted(held.channels())))

    async def recount(self, environment_id: str, user_id: str, invisible: bool, channels: Sequence[str]) -> None:
        """Take an invisible user out of their channels' online sets, or put a visible one back.

        The sets are what occupancy counts and snapshots name, and an invisible user looks offline.
        A refresh in flight was built before the change and would write the user back: the
        change goes once Redis has answered it (the next refresh knows).
        """
        refreshing = self._refreshing
        if refreshing is not None:
            await asyncio.shield(refreshing)
        if invisible:
            await self.store.channels_gone([(user_id, channels)])
        else:
            await self.store.channels_seen({channel_id: [user_id] for channel_id in channels}, self.timings.seen_for)

    def _forget(self, subject: Subject, connection_id: str) -> bool:
        """Drop one connection; return True when it was the user's last on this instance."""
        held = self.held.get(subject)
        if held is None:
            return False
        held.connections.pop(connection_id, None)
        if held.connections:
            return False
        del self.held[subject]
        return True

    # ── the grace check ──────────────────────────────────────────────────────
    def _arm_grace_check(
        self,
        subject: Subject,
        epoch: str | None,
        delay_ms: int | None = None,
        last_seen_ms: int | None = None,
        token: str | None = None,
        tried: list[str] | None = None,
    ) -> None:
        # One pending check per user, REPLACED: close, reopen, close inside one window must
        # leave one decision, taken at the end of the last window; two would publish twice.
        previous = self.pending.pop(subject, None)
        if previous is not None:
            previous.cancel()
        # When the user was last seen (their last close here), for `user.offline`'s webhook.
        last_seen_ms = last_seen_ms or int(time.time() * 1000)
        # The check's token, kept by its retries: its transition id, and the marker's value, by
        # which a retry learns that a try whose reply was lost decided (GRACE_CHECK's outcome 4).
        token = token or str(uuid.uuid4())
        check = functools.partial(self._grace_check, subject, epoch, last_seen_ms, token, tried)
        delay = self.timings.check_delay if delay_ms is None else delay_ms
        self.pending[subject] = self.clock.call_later(delay / 1000, functools.partial(self._fire, subject, check))

    def _fire(self, subject: Subject, work: Callable[[], Awaitable[None]]) -> None:
        self.pending.pop(subject, None)
        if self.closed:
            return
        self.spawn(work())

    def spawn(self, work: Awaitable[None]) -> None:
        """Run `work` as a task of this service: a shutdown cancels it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _grace_check(
        self, subject: Subject, epoch: str | None, last_seen_ms: int, token: str, tried: list[str] | None = None
    ) -> None:
        """Decide the user's `offline` after their last close (`tried`: where a try whose reply was
        lost had its script PUBLISH it)."""
        environment_id, user_id = subject
        if settling := self.unsettled_for():
            # This instance found Redis had lost its users' keys moments ago: the user's other
            # holders may not have re-elected them yet, so the key's absence says nothing.
            suppressed(user_id, "offline", SETTLING)
            if subject not in self.held and not self.closed:
                self._arm_grace_check(subject, epoch, settling * 1000, last_seen_ms, token, tried)
            return
        if self._unanswered and await self.store.epoch(environment_id, user_id) is not None:
            # Redis answers again, and no refresh ran to learn it (this instance may hold nobody).
            self._answered_again()
        if recovering := self._recovering_for():
            # Redis did not answer this instance moments ago: another instance may have let the
            # user in meanwhile without an election, which its next answered refresh makes.
            suppressed(user_id, "offline", RECOVERING)
            if subject not in self.held and not self.closed:
                self._arm_grace_check(subject, epoch, recovering * 1000, last_seen_ms, token, tried)
            return
        retry = functools.partial(self._check_again, subject, epoch, last_seen_ms, token, tried)
        # The channels at the decision, not at the close: a channel the user was added to during
        # the grace may have heard them announced `online` (presence.announce), and must hear
        # them leave; one they were removed from must not.
        try:
            ordered = sorted(await read_channel_ids(environment_id, user_id))
            # An invisible user's watchers heard `offline` when they turned invisible.
            hidden = await read_invisible(environment_id, user_id)
        except Exception as error:
            record_failure("grace_check:channels", error)
            retry()
            return
        publish = self._script_publishes("offline", user_id, ordered, token, hidden)
        reply = await self.store.grace_check(
            environment_id, user_id, epoch, publish or (), ordered, last_seen_ms, token=token
        )
        if reply is None:
            self._unanswered = True
            # Logged as `presence.failed`. Asked again (the same marker election) rather than left:
            # a Redis blip at this moment would otherwise leave the user online for good. The
            # script may have run all the same, its reply lost: the retry, with the same token,
            # learns so, and where its PUBLISHes went.
            self._check_again(subject, epoch, last_seen_ms, token, ordered if publish is not None else tried)
            return
        outcome, now, decided_ms = reply
        if outcome == 3:
            # Redis lost its data since the close (a restart, an eviction): the key's absence says
            # nothing yet. The live holders re-elect it at their next refresh; ask again after it,
            # in the new epoch.
            suppressed(user_id, "offline", EPOCH_CHANGED)
            self._check_again(subject, now, last_seen_ms, token, tried)
        elif outcome == 0:
            suppressed(user_id, "offline", STILL_OPEN)
        elif outcome == 2:
            suppressed(user_id, "offline", ANOTHER_PUBLISHED)
        else:
            # Decided by this check: now (1), or by a try whose reply was lost (4).
            if publish is None:
                heard = None
            elif outcome == 1:
                heard = ordered
            else:
                heard = ordered if tried is None else tried
            await self._decided_offline(subject, token, ordered, heard, decided_ms, last_seen_ms, hidden)

    async def _decided_offline(
        self,
        subject: Subject,
        transition_id: str,
        ordered: list[str],
        heard: list[str] | None,
        decided_ms: int,
        last_seen_ms: int,
        hidden: bool,
    ) -> None:
        """Publish what the grace check's script did not, and take the user out of their channels' online sets.

        `heard`: the channels the script PUBLISHed the `offline` to; None when it cannot publish
        (a separate presence Redis), and the layer carries it all from here.
        """
        environment_id, user_id = subject
        if heard is not None:
            self._owed.pop(subject, None)
            _published(environment_id, user_id, "offline", len(heard), last_seen_ms)
            self._sent(subject, Owed("offline", heard, transition_id, hidden))
        # The channels again, read after the decision: a membership committed after the read
        # above may have been announced `online` to its channel while the key still stood
        # (presence.announce, also a script), and must hear the `offline`. None can be announced
        # after the decision: the key is gone.
        try:
            channels = sorted(await read_channel_ids(environment_id, user_id))
        except Exception as error:
            record_failure("grace_check:channels", error)
            channels = ordered
        if heard is None:
            await self.publish(environment_id, user_id, "offline", channels, transition_id, last_seen_ms, hidden)
            heard = channels
        elif extra := sorted(set(channels) - set(heard)):
            # Only those the script's copies missed: a watcher who also shares a channel of
            # `heard` was told, maybe by a single copy that left no id to deduplicate by.
            audience = await self._newly_told(environment_id, user_id, extra, heard)
            if audience and not hidden:
                await self.publish(environment_id, user_id, "offline", extra, transition_id, audience=audience)
        await self.store.channels_gone([(user_id, sorted(set(channels) | set(heard)))], decided_ms)

    async def _newly_told(self, environment_id: str, user_id: str, extra: list[str], heard: list[str]) -> list[str]:
        try:
            return await read_members_seeing_only(environment_id, user_id, extra, heard)
        except Exception as error:
            record_failure("grace_check:channels", error)
            return []

    def _check_again(
        self,
        subject: Subject,
        epoch: str | None,
        last_seen_ms: int | None = None,
        token: str | None = None,
        tried: list[str] | None = None,
    ) -> None:
        """Run the grace check again one refresh interval on, unless a newer close armed its own."""
        if subject not in self.pending and subject not in self.held and not self.closed:
            delay = self.timings.refresh + self.timings.margin
            self._arm_grace_check(subject, epoch, delay, last_seen_ms, token, tried)

    async def _last_seen(self, subjects: list[Subject], closed_at: float) -> None:
        """Keep when these users were last seen (durable: docs/contract.md, Rich presence)."""
        try:
            await write_last_seen(subjects, closed_at)
        except Exception as error:
            record_failure("last_seen", error)

    def next_answer(self) -> asyncio.Future:
        """Resolved when a refresh next gets Redis's answer (what a failed snapshot's repair waits for)."""
        if self._answered is None or self._answered.done():
            self._answered = asyncio.get_running_loop().create_future()
        return self._answered

    # ── refresh and reap ─────────────────────────────────────────────────────
    def _ensure_ticker(self) -> None:
        if not self.closed:
            self.refresher.start()
            self.reaper.start()

    def _every_interval(self, name: str, work: Callable[[], Awaitable[None]]) -> Periodic:
        return Periodic(
            work,
            interval=lambda: self.timings.refresh / 1000,
            clock=lambda: self.clock,
            # Redis faults are handled inside; this is the net that keeps one unexpected error
            # from ending refresh or reaping for good.
            failed=functools.partial(record_failure, name),
            wanted=lambda: bool(self.held or self._owed or self._recent) and not self.closed,
        )

    async def _refresh(self) -> None:
        self._copy_around_loss()
        await self._retry_owed()
        snapshot = {}
        for subject, held in self.held.items():
            if admitted := held.admitted():
                channels = frozenset(held.channels())
                snapshot[member(*subject)] = (subject, held, admitted, channels)
        if not snapshot:
            return
        sent = [
            (name, None if held.written == channels else sorted(channels), admitted)
            for name, (_, held, admitted, channels) in snapshot.items()
        ]
        seen: dict[str, list[str]] = {}
        for (_, user_id), held, _, channels in snapshot.values():
            if held.invisible:
                continue  # counted nowhere: they look offline (docs/contract.md, Rich presence)
            for channel_id in channels:
                seen.setdefault(channel_id, []).append(user_id)
        self._refreshing = asyncio.get_running_loop().create_future()
        began = time.monotonic()
        try:
            reply = await self.store.refresh(sent)
            await self.store.channels_seen(seen, self.timings.seen_for)
        finally:
            self._refreshing.set_result(None)
            self._refreshing = None
        if reply is None:
            self._unanswered = True
            return
        if self._unanswered:
            self._answered_again()
        if self._answered is not None and not self._answered.done():
            self._answered.set_result(None)
        vanished, unwritten = reply
        for _, held, _, channels in snapshot.values():
            held.written = channels
        for name in unwritten:
            snapshot[name][1].written = None  # sent again next time
        if vanished:
            self._losses.append((self._answered_began, time.monotonic()))
            self._settling(self.timings.rejoin)
        self._answered_began = began
        unheard = []
        for name, had_marker in vanished:
            subject, held, _, channels = snapshot[name]
            suppressed(subject[1], "online", VANISHED)
            # If an `offline` went out meanwhile (the marker stood) or this user was never
            # announced (Redis was down at connect), watchers must hear `online` to converge.
            if had_marker or not held.confirmed:
                unheard.append((subject, held, channels))
        if unheard and not self.closed:
            members = await self._channels_now([subject for subject, _, _ in unheard])
            for subject, held, channels in unheard:
                # To the channels the refresh wrote with the key: the user's connections here may
                # have closed while earlier ones were published (their close then decides after).
                # Less those the user has left: the notice of a removal made while Redis was away
                # was lost, and reaches the connections only with the reconciliation.
                ordered = sorted(channels & members[subject] if subject in members else channels)
                await self.publish(*subject, "online", ordered, hidden=held.invisible)
                await self.store.write_event(*subject, "online", ordered)
        for _, held, _, _ in snapshot.values():
            held.confirmed = True

    async def _channels_now(self, subjects: list[Subject]) -> dict[Subject, set[str]]:
        """Each user's channels in the database now; {} when it cannot say (logged)."""
        try:
            return await read_channel_ids_of_members(subjects)
        except Exception as error:
            record_failure("refresh:channels", error)
            return {}

    async def _reap(self) -> None:
        """Decide every due deadline, a pass over every bucket at a time, until fewer than a batch were due in each."""
        if self._unanswered or self._recovering_for() or self.unsettled_for():
            # As a grace check waits (`_check`): Redis did not answer this instance lately, or
            # lost its data, and a holder may not have elected (or re-elected) a user it let in.
            return
        prefix = None if self.closed else channel_layer().group_channel_prefix(GROUP_PREFIX, self.store.url)
        while not self.closed:
            reaped = await self.store.reap(prefix)
            if reaped is None:
                return
            unpublished = []
            departed: list[Subject] = []
            # A reaped user's entries in their channels' online sets outlast the decision
            # (Timings.seen_for): taken out now, as the grace check takes out its user's.
            gone: list[tuple[str, list[str]]] = []
            for name, won, channels, transition_id in reaped.decided:
                subject = split_member(name)
                if not won:
                    suppressed(subject[1], "offline", ANOTHER_PUBLISHED)
                    continue
                departed.append(subject)
                gone.append((subject[1], channels))
                # An invisible user's watchers heard `offline` when they turned invisible: nothing to send.
                if prefix is not None or name in reaped.hidden:
                    self._owed.pop(subject, None)
                    _published(*subject, "offline", len(channels))
                    if transition_id:
                        self._sent(subject, Owed("offline", channels, transition_id))
                else:
                    unpublished.append((subject, Owed("offline", channels, str(uuid.uuid4()))))
            if departed:
                # Their holder died silently: the deadline passed just now, so "last seen" is about
                # now. Written beside the reaping, never in its way.
                self.spawn(self._last_seen(departed, time.time()))
            await self._publish_in_turn(unpublished)
            await self.store.channels_gone(gone, reaped.decided_ms)
            if reaped.due < REAP_BATCH:
                return

    async def _publish_in_turn(self, transitions: list[tuple[Subject, Owed]]) -> None:
        """Publish each through the layer; after a failure the rest are owed without trying (one timeout, not n)."""
        for index, (subject, owed) in enumerate(transitions):
            if not await self.publish(*subject, owed.state, owed.channels, owed.transition_id):
                for later, rest in transitions[index + 1 :]:
                    self._owe(later, rest)
                return

    def _owe(self, subject: Subject, owed: Owed) -> None:
        self._owed[subject] = owed
        self._ensure_ticker()

    async def _retry_owed(self) -> None:
        """Publish each owed transition again while Redis still says it is the user's state.

        Checked first, because the publish comes too late otherwise: an `online` owed to a user
        who has left since (or an `offline` to one who came back, through another instance)
        would put watchers in a state that no longer holds. The same transition id as the failed
        try, so a watcher that got part of it drops the copy. Same check as a separate presence
        Redis allows (not atomic with the publish): a change between the two is followed by its
        own transition.
        """
        now = time.monotonic()
        owed = {subject: entry for subject, entry in self._owed.items() if (entry.copy_at or now) <= now}
        users: dict[str, list[str]] = {}
        for environment_id, user_id in owed:
            users.setdefault(environment_id, []).append(user_id)
        for environment_id, user_ids in users.items():
            online = await self.store.online(environment_id, user_ids)
            if online is None:
                return  # logged by the store; asked again next interval
            for user_id in user_ids:
                subject = (environment_id, user_id)
                entry = owed[subject]
                if self._owed.get(subject) is not entry:
                    continue  # a newer transition of the user was decided meanwhile
                if (user_id in online) != (entry.state == "online"):
                    del self._owed[subject]
                    suppressed(user_id, entry.state, SUPERSEDED)
                    continue
                if entry.copy_at is not None:
                    del self._owed[subject]
                    await self._send(subject, entry)
                else:
                    await self.publish(
                        environment_id,
                        user_id,
                        entry.state,
                        entry.channels,
                        entry.transition_id,
                        hidden=entry.hidden,
                        audience=entry.audience,
                    )

    def _sent(self, subject: Subject, owed: Owed) -> None:
        """Note a transition that went out: kept a while (`_copy_around_loss`), copied if the layer is just back."""
        now = time.monotonic()
        self._recent.pop(subject, None)
        self._recent[subject] = (now, owed)
        self._forget_sent(now)
        self._again_if_unsteady(subject, owed)

    def _forget_sent(self, now: float) -> None:
        """Let go of what went out more than the margin before now, or before a loss not yet copied for.

        A loss is found after it happened, so nothing older can need a copy.
        """
        lost = channel_layer().lost_at()
        since = (lost if lost > self._copied_loss else now) - self.timings.margin / 1000
        while self._recent:
            subject, (at, _) = next(iter(self._recent.items()))
            if at >= since:
                return
            del self._recent[subject]

    def _copy_around_loss(self) -> None:
        """Send again what went out from the margin before the layer lost a connection, once it is back.

        A cut connection loses what was still on its way to its subscriber, though Redis took it
        (pub/sub keeps nothing): every instance's is cut when Redis's network fails, and the
        publisher, losing its own, sends again what it published around then. The same id: a
        watcher that had it drops the copy. A refresh interval after the layer came back, when the
        others have too; checked and superseded like an owed one.
        """
        layer = channel_layer()
        lost, back = layer.lost_at(), layer.back_at()
        if lost > self._copied_loss and back >= lost:
            self._copied_loss = lost
            since = lost - self.timings.margin / 1000
            copy_at = back + self.timings.refresh / 1000
            for subject, (at, owed) in self._recent.items():
                if at >= since and subject not in self._owed:
                    self._owe(subject, replace(owed, copy_at=copy_at))
        self._forget_sent(time.monotonic())

    def _again_if_unsteady(self, subject: Subject, owed: Owed) -> None:
        """Send a transition that just went out once more, a refresh interval later, if the layer's Redis is just back.

        A restart (or a cut connection) takes every instance's pub/sub connection down, and what
        is published before an instance has subscribed again is not heard there (pub/sub keeps
        nothing). This instance's own came back moments ago; a refresh interval later the others
        have too. The same id: a watcher that had it drops the copy. Checked and superseded like
        an owed one, so a copy never undoes a newer transition.
        """
        window = self.timings.refresh / 1000
        now = time.monotonic()
        if now - channel_layer().back_at() < window and subject not in self._owed:
            self._owe(subject, replace(owed, copy_at=now + window))

    async def _send(self, subject: Subject, owed: Owed) -> None:
        """Publish a copy of a transition that already went out (not counted, logged or hooked again)."""
        sends = _group_sends(
            subject[1], owed.state, owed.channels, owed.transition_id, owed.hidden, owed.audience, again=True
        )
        try:
            await channel_layer().group_send_many(sends)
        except Exception as error:
            record_failure("publish", error)

    # ── publishing ───────────────────────────────────────────────────────────
    async def publish(
        self,
        environment_id: str,
        user_id: str,
        state: State,
        channel_ids: Iterable[str],
        transition_id: str | None = None,
        last_seen_ms: int | None = None,
        hidden: bool = False,
        audience: list[str] | None = None,
    ) -> bool:
        """Send one transition, its id minted once, to the group of each of the user's channels.

        Returns whether it went out. A failure is logged as `presence.failed` and the transition
        owed: the refresh publishes it again until it lands, or a newer one of the user's
        supersedes it.
        """
        if self.closed:
            return False
        subject = (environment_id, user_id)
        channels = sorted(channel_ids)
        transition_id = transition_id or str(uuid.uuid4())
        # This is now the user's newest transition here: an older one owed is superseded.
        self._owed.pop(subject, None)
        sends = _group_sends(user_id, state, channels, transition_id, hidden, audience)
        try:
            # One pipelined round trip for all of the user's channels.
            await channel_layer().group_send_many(sends)
        except Exception as error:
            record_failure("publish", error)
            self._owe(subject, Owed(state, channels, transition_id, hidden, audience))
            return False
        _published(environment_id, user_id, state, len(channels), last_seen_ms)
        self._sent(subject, Owed(state, channels, transition_id, hidden, audience))
        return True

    def _script_publishes(
        self, state: State, user_id: str, channels: Sequence[str], transition_id: str, hidden: bool = False
    ) -> list[tuple[str, bytes]] | None:
        """The transition as PUBLISHes for a presence script to send, or None when it cannot.

        It can when the channel layer's groups live on the presence Redis (the default: one
        RELAY_REDIS_URL). A separate presence Redis (RELAY_PRESENCE_REDIS_URL) publishes through
        the layer afterwards, as `publish` does.
        """
        if self.closed:
            return None  # `publish` then declines too: nothing goes out after a shutdown began
        return channel_layer().publications(
            _group_sends(user_id, state, channels, transition_id, hidden), self.store.url
        )

    # ── shutdown ─────────────────────────────────────────────────────────────
    def stop(self) -> None:
        """Cancel every timer and task; nothing is published after this returns."""
        self.closed = True
        for handle in self.pending.values():
            handle.cancel()
        self.pending.clear()
        self.refresher.cancel()
        self.reaper.cancel()
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Stop, free this instance's connection slots at once, then close the Redis client.

        Keys are left to expire: the users' `offline` is a surviving instance's to decide
        (its reaper), and whether they reconnect elsewhere inside the grace is Redis's.
        """
        self.stop()
        held = [(subject, list(h.connections)) for subject, h in self.held.items()]
        self.held.clear()
        await self.store.forget_connections(held)
        await self.store.close()


# The presence service of the running event loop (its Redis client and timers belong to it).
service = PerLoop(PresenceService)


def running_services() -> list[PresenceService]:
    """Every service still attached to a live loop (for shutdown)."""
    return service.every()
