"""How presence plugs into every connection: the registry extension and the transition handler."""

import asyncio
import functools
import logging
import time
from collections.abc import Sequence

from presence import actions, announce, delivery, handlers, reads
from presence.delivery import STATE_KEY
from presence.fabric import STATUS_CHANGE, TRANSITION, Dedup, group_name, parse_fabric, parse_transition
from presence.queries import large_channel_ids
from relay import registry
from relay.frames import PresenceChanged, PresenceOccupancy, PresenceSnapshot
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.models import User
from relay.registry import Connection

logger = logging.getLogger("presence")

registry.sends("presence.snapshot", PresenceSnapshot)
registry.sends("presence.changed", PresenceChanged)
registry.sends("presence.occupancy", PresenceOccupancy)

# Who of the co-members was online at the election, read in its round trip; sent after the ack.
SNAPSHOT_KEY = "presence.snapshot"
# The task that, once Redis answers again, repairs a snapshot Redis could not read.
REPAIR_TASK_KEY = "presence.repair"
# The event, on the connection's own queue, that does the repair.
REPAIR = "presence.repair"
OCCUPANCY_KEY = "presence.occupancy"
# For how long (ms) the snapshot read at the election may miss users still to be re-elected.
UNSETTLED_KEY = "presence.unsettled"
# For how long (ms) this instance may yet find that the snapshot was read in a Redis that lost its
# data, and when (monotonic s) it was read.
YOUNG_KEY = "presence.young"
# The user's channels whose members may not have heard the `online` the election took over.
UNHEARD_KEY = "presence.unheard"
# The timer that then repairs the connection, or lets its kept view go.
VIEW_CHECK_KEY = "presence.view_check"
# The event, on the connection's own queue, that tells it who a channel it joined made visible.
ANNOUNCE_CHANNEL = "presence.announce_channel"


class PresenceExtension(registry.Extension):
    """Joins the presence groups, runs the election, sends the snapshot, arms the grace check."""

    # Early: the 4429 refusal comes before any other app does work for a connection it refuses,
    # and the snapshot directly follows the ack, ahead of a resume's backlog (contract section 3).
    order = 10

    def load(self, connects: Sequence[tuple[User, frozenset[str]]]) -> list[tuple[list[str], frozenset[str]]]:
        """Each connect's large channels, and the co-members (and the user) its snapshot reports, in one hop.

        Members of large channels are not read: the snapshot counts those (docs/contract.md,
        Large rooms), so a connect costs the same whatever the size of its large channels.
        """
        large = large_channel_ids({channel_id for _, channel_ids in connects for channel_id in channel_ids})
        watch = reads.co_member_ids_of(
            [(str(user.environment_id), user.external_id, channel_ids - large) for user, channel_ids in connects]
        )
        return [(ids, channel_ids & large) for ids, (_, channel_ids) in zip(watch, connects, strict=True)]

    def group(self, channel_id: str) -> str:
        # Joined by the consumer BEFORE the election (`admit`): the subject hears its own
        # `online`, and a watcher never misses a transition raced with its own connect (it is
        # queued behind the snapshot, whose read is in the election's round trip, after the join).
        return group_name(channel_id)

    def joining(self, conn: Connection) -> None:
        # Until the snapshot is sent, the transitions of the groups it joins wait behind it.
        delivery.fanout().join(conn)

    async def admit(self, conn: Connection) -> None:
        conn.state[STATE_KEY] = Dedup()
        watch, large = conn.loaded.get(self) or (None, frozenset())
        delivery.fanout().modes(conn.channel_ids, large)
        read = await actions.service().connect(conn, watch or (), large)
        online, occupancy, unsettled, young, epoch, unheard = read or (None, {}, 0, 0, None, frozenset())
        if unheard:
            conn.state[UNHEARD_KEY] = unheard
        if watch is not None:
            # None: Redis did not answer the election (nor so the snapshot's read).
            conn.state[SNAPSHOT_KEY] = None if online is None else sorted(online)
            conn.state[OCCUPANCY_KEY] = occupancy
            if unsettled:
                conn.state[UNSETTLED_KEY] = unsettled
            elif young:
                conn.state[YOUNG_KEY] = (young, time.monotonic(), epoch)

    async def opened(self, conn: Connection) -> None:
        repair: tuple[float | None] | None = None
        try:
            repair = await self._snapshot(conn)
        finally:
            # Last, and even when the snapshot failed: what was kept for the connection goes out
            # after the snapshot, and a transition written straight to the socket too.
            await delivery.fanout().live(conn)
        if repair is not None:
            _owe_repair(conn, *repair)
        # Channels added while the user's key was gone, whose members never heard the `online`
        # this connection took over (`actions._unheard`): announced as their holder would.
        for channel_id in sorted(conn.state.pop(UNHEARD_KEY, ())):
            await announce.announce_held(conn.environment_id, conn.user_id, channel_id)

    async def _snapshot(self, conn: Connection) -> tuple[float | None] | None:
        """Send the snapshot; whether a repair is owed, and after how long (None: once Redis answers)."""
        occupancy = conn.state.pop(OCCUPANCY_KEY, None)
        unsettled = conn.state.pop(UNSETTLED_KEY, 0)
        if SNAPSHOT_KEY in conn.state:
            online = conn.state.pop(SNAPSHOT_KEY)
        else:
            # The database hop could not read the co-members: read them (and their keys) now.
            online = await reads.snapshot(conn)
        shown, statuses = await handlers.snapshot_status(conn, online or [])
        snapshot = PresenceSnapshot(online=shown, status=statuses)
        if occupancy:
            snapshot["occupancy"] = occupancy
        await conn.send_frame("presence.snapshot", snapshot)
        await handlers.after_snapshot(conn, statuses)
        if online is None:
            # Redis did not answer: the snapshot went out empty, and no transition would ever
            # tell this watcher about co-members who stay online (docs/contract.md, "Fair under
            # load and faults"). They are sent as `online`s once Redis answers, but for those
            # a transition told it of meanwhile (its view is kept from the snapshot on).
            conn.state[delivery.VIEW_KEY] = delivery.View(shown)
            return (None,)
        if unsettled:
            # Read in a Redis that lost its data moments ago: co-members whose holders have not
            # re-elected them yet are missing, and stay online without a word. Once they have,
            # the repair tells this watcher those its view still lacks.
            conn.state[delivery.VIEW_KEY] = delivery.View(shown)
            return (unsettled / 1000,)
        if young := conn.state.pop(YOUNG_KEY, None):
            # Read in a young epoch, maybe just after Redis restarted empty and before this
            # instance's refresh found out (the read then misses co-members not re-elected yet,
            # whose re-election is silent): the view is kept until the refresh would have.
            conn.state[delivery.VIEW_KEY] = delivery.View(shown)
            left, read_at, epoch = young
            check = asyncio.get_running_loop().call_later(left / 1000, _check_view, conn, read_at, epoch)
            conn.state[VIEW_CHECK_KEY] = check
        return None

    async def channel_added(self, conn: Connection, channel_id: str) -> None:
        # Into the channel's online set now, not at the next refresh: a co-member connecting
        # meanwhile reads the set for its snapshot (presence.announce writes it before the API
        # answers; this covers a change whose notice came another way, or whose write failed).
        service = actions.service()
        if not service.hidden(conn.environment_id, conn.user_id):
            await service.store.channels_seen({channel_id: [conn.user_id]}, service.timings.seen_for, "channel_joined")
        large = await delivery.read_large_channel_ids({channel_id})
        delivery.fanout().modes({channel_id}, large)
        if not large:
            if settling := actions.service().unsettled_for():
                # Redis lost its data moments ago: co-members not re-elected yet would be missed,
                # and their re-election is silent. Told once every live holder has re-elected,
                # when the user is announced to the channel too (`announce.announce_held`).
                _later(conn, settling, {"type": ANNOUNCE_CHANNEL, "channel": channel_id})
            else:
                read_at = time.monotonic()
                # The request's announcement can find the user offline between a close's grace
                # and a connect whose channels were read before the change: their holder tells.
                await announce.announce_held(conn.environment_id, conn.user_id, channel_id)
                if (told := await _announce_channel(conn, channel_id)) is not None:
                    # Maybe read just after Redis lost its data, before this instance's refresh
                    # found out: asked again, for those not told, if the refresh then finds it
                    # (and the user announced again).
                    timings = actions.service().timings
                    again = (timings.rejoin + timings.refresh) / 1000
                    asyncio.get_running_loop().call_later(
                        again, _announce_again_if_lost, conn, channel_id, read_at, told
                    )
            return
        # A large channel is counted, not named: its count now, then as it changes.
        counts = await actions.service().store.occupancy([channel_id])
        if counts is not None:
            frame = PresenceOccupancy(channel=channel_id, online=counts[channel_id])
            await conn.send_frame("presence.occupancy", frame)

    async def channel_removed(self, conn: Connection, channel_id: str) -> None:
        # Out of the channel's online set: it no longer counts or names the user there.
        await actions.service().store.channels_gone([(conn.user_id, [channel_id])])

    async def closed(self, conn: Connection) -> None:
        # Membership changes need nothing more: the consumer follows them with the groups, and the
        # grace check reads the user's channels when it decides.
        delivery.fanout().gone(conn)
        if repair := conn.state.pop(REPAIR_TASK_KEY, None):
            repair.cancel()
        if check := conn.state.pop(VIEW_CHECK_KEY, None):
            check.cancel()
        await actions.service().disconnect(conn)


@registry.event(TRANSITION)
async def presence_transition(conn: Connection, message: dict) -> None:
    """A transition queued for this connection (behind what the connection had queued, or before
    it was live): delivered as `Fanout` delivers the others."""
    await delivery.deliver(conn, message, functools.partial(parse_transition, message))


@registry.event(STATUS_CHANGE)
async def presence_status_change(conn: Connection, message: dict) -> None:
    """A status change queued for this connection: delivered as `Fanout` delivers the others."""
    await delivery.deliver(conn, message, functools.partial(parse_fabric, message))


async def _announce_channel(conn: Connection, channel_id: str, exclude: Sequence[str] = ()) -> list[str] | None:
    told = await reads.announce_new_co_members(conn, channel_id, exclude)
    if told is None:
        # Redis did not answer: who the new channel made visible is told with the repair.
        _owe_repair(conn)
    return told


def _announce_again_if_lost(conn: Connection, channel_id: str, read_at: float, told: list[str]) -> None:
    service = actions.service()
    if service.lost_before(read_at):
        _later(conn, service.unsettled_for(), {"type": ANNOUNCE_CHANNEL, "channel": channel_id, "told": told})


def _later(conn: Connection, delay: float, message: dict) -> None:
    """Queue `message` on the connection's own queue after `delay` seconds (behind what it then holds)."""
    asyncio.get_running_loop().call_later(delay, channel_layer().send_local, conn.channel_name, message)


@registry.event(ANNOUNCE_CHANNEL)
async def presence_announce_channel(conn: Connection, message: dict) -> None:
    """Tell the connection who a channel it joined while Redis was settling made visible, if it still has it.

    And announce its user to the channel again: the request's announcement may have found them
    not re-elected yet.
    """
    if message["channel"] in conn.channel_ids:
        await announce.announce_held(conn.environment_id, conn.user_id, message["channel"])
        await _announce_channel(conn, message["channel"], message.get("told", ()))


def _check_view(conn: Connection, read_at: float, epoch: str | None) -> None:
    """Repair a snapshot (or a repair's read) since found read in a Redis that lost its data; else drop the view."""
    conn.state.pop(VIEW_CHECK_KEY, None)
    pending = conn.state.get(REPAIR_TASK_KEY)
    if pending is not None and not pending.done():
        return  # that repair reads the view
    if actions.service().lost_before(read_at):
        conn.state[REPAIR_TASK_KEY] = asyncio.ensure_future(_repair_if_read_after_the_loss(conn, read_at, epoch))
    else:
        conn.state.pop(delivery.VIEW_KEY, None)


async def _repair_if_read_after_the_loss(conn: Connection, read_at: float, epoch: str | None) -> None:
    # Its user's bucket still in the epoch of the read: the read came after the loss began it.
    # None: a repair's read, whose epoch is not known; made again.
    service = actions.service()
    if epoch is not None and not service.lost_after(read_at):
        now = await service.store.epoch(conn.environment_id, conn.user_id)
        if now is not None and now != epoch:
            # In no epoch, or another: Redis may have lost its data again since, which this
            # instance may not know yet (a pause past the TTL ending as this read waits through
            # it: the commands queued ahead of the read begin another epoch). Or the read came
            # before the loss, whole, and the repair tells nothing. Made once the live holders
            # have re-elected their users.
            await _repair_when_redis_answers(conn)
            return
    await _repair_when_redis_answers(conn, service.unsettled_for())


def _owe_repair(conn: Connection, after: float | None = None) -> None:
    """Repair the connection's view once Redis answers (or `after` seconds), unless a repair is already on its way."""
    pending = conn.state.get(REPAIR_TASK_KEY)
    if pending is None or pending.done():
        conn.state[REPAIR_TASK_KEY] = asyncio.ensure_future(_repair_when_redis_answers(conn, after))


async def _repair_when_redis_answers(conn: Connection, after: float | None = None) -> None:
    if after is not None:
        # Redis answered; the live holders re-elect their users within this time.
        await actions.service().clock.sleep(after)
    else:
        # Redis answers again; then every live holder's refresh re-elects the users whose keys it
        # lost (emptied, or expired in a pause longer than the TTL), silently for those watchers
        # still believe online, within `Timings.rejoin`. Read before that, they would be missing.
        service = actions.service()
        # Shielded: the future is every waiting repair's, and a cancelled await cancels what it
        # awaits; one connection closing would cancel the repairs of all the others.
        await asyncio.shield(service.next_answer())
        await service.clock.sleep(service.timings.rejoin / 1000)
    # From here on the connection's transitions queue behind the repair, which reads after them.
    delivery.fanout().gone(conn)
    channel_layer().send_local(conn.channel_name, {"type": REPAIR})


@registry.event(REPAIR)
async def presence_repair(conn: Connection, message: dict) -> None:
    """Tell a connection Redis could not answer for (its snapshot, a new channel's co-members) who is online now.

    Then it is delivered to directly again. With its view kept since the snapshot (a snapshot
    read in a Redis that lost its data), only co-members missing from it are told; without, a
    co-member it already knew to be online, or who came online since, may be told twice. One who
    left was told.
    """
    service = actions.service()
    if settling := service.unsettled_for():
        # Redis lost its data again since the repair was armed: read once every live holder has
        # re-elected its users. The view stays kept, and transitions queue behind the repair.
        _owe_repair(conn, settling)
        return
    read_at = time.monotonic()
    online = await reads.snapshot(conn)
    if online is None:
        _owe_repair(conn)
    else:
        view = conn.state.pop(delivery.VIEW_KEY, delivery.View(()))
        # An invisible co-member looks offline to watchers (docs/contract.md, Rich presence).
        hidden = await reads.invisible_among(conn.environment_id, [u for u in online if u != conn.user_id])
        told = [user_id for user_id in online if user_id not in view and user_id not in hidden]
        for user_id in told:
            view.add(user_id)
            await conn.send_frame("presence.changed", PresenceChanged(user=user_id, state="online"))
        log_event(logger, Event.PRESENCE_REPAIRED, connection_id=conn.connection_id, told=len(told))
        # Maybe read just after Redis lost its data again, before this instance's refresh found
        # out: the view is kept until it would have, and the repair made again if it did.
        conn.state[delivery.VIEW_KEY] = view
        if earlier := conn.state.pop(VIEW_CHECK_KEY, None):
            earlier.cancel()
        again = (service.timings.rejoin + service.timings.refresh) / 1000
        conn.state[VIEW_CHECK_KEY] = asyncio.get_running_loop().call_later(again, _check_view, conn, read_at, None)
    await delivery.fanout().live(conn)
