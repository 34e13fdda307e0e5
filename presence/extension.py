"""How presence plugs into every connection: the registry extension and the transition handler."""

import functools
from collections.abc import Sequence

from presence import actions, delivery, handlers, reads
from presence.delivery import STATE_KEY
from presence.fabric import STATUS_CHANGE, TRANSITION, Dedup, group_name, parse_fabric, parse_transition
from presence.queries import large_channel_ids
from relay import registry
from relay.frames import PresenceChanged, PresenceOccupancy, PresenceSnapshot
from relay.models import User
from relay.registry import Connection

registry.sends("presence.snapshot", PresenceSnapshot)
registry.sends("presence.changed", PresenceChanged)
registry.sends("presence.occupancy", PresenceOccupancy)

# Who of the co-members was online at the election, read in its round trip; sent after the ack.
SNAPSHOT_KEY = "presence.snapshot"
OCCUPANCY_KEY = "presence.occupancy"


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

    async def admit(self, conn: Connection) -> None:
        conn.state[STATE_KEY] = Dedup()
        watch, large = conn.loaded.get(self) or (None, frozenset())
        delivery.fanout().modes(conn.channel_ids, large)
        read = await actions.service().connect(conn, watch or (), large)
        online, occupancy = read or ([], {})
        if watch is not None:
            conn.state[SNAPSHOT_KEY] = sorted(online)
            conn.state[OCCUPANCY_KEY] = occupancy

    async def opened(self, conn: Connection) -> None:
        online = conn.state.pop(SNAPSHOT_KEY, None)
        occupancy = conn.state.pop(OCCUPANCY_KEY, None)
        if online is None:
            # The database hop could not read the co-members: read them (and their keys) now.
            online = await reads.snapshot(conn)
        online, statuses = await handlers.snapshot_status(conn, online)
        snapshot = PresenceSnapshot(online=online, status=statuses)
        if occupancy:
            snapshot["occupancy"] = occupancy
        await conn.send_frame("presence.snapshot", snapshot)
        await handlers.after_snapshot(conn, statuses)
        # Last: a transition written straight to the socket must come after the snapshot.
        delivery.fanout().live(conn)

    async def channel_added(self, conn: Connection, channel_id: str) -> None:
        large = await delivery.read_large_channel_ids({channel_id})
        delivery.fanout().modes({channel_id}, large)
        if not large:
            await reads.announce_new_co_members(conn, channel_id)
            return
        # A large channel is counted, not named: its count now, then as it changes.
        counts = await actions.service().store.occupancy([channel_id])
        if counts is not None:
            frame = PresenceOccupancy(channel=channel_id, online=counts[channel_id])
            await conn.send_frame("presence.occupancy", frame)

    async def closed(self, conn: Connection) -> None:
        # Membership changes need nothing more: the consumer follows them with the groups, and the
        # grace check reads the user's channels when it decides.
        delivery.fanout().gone(conn)
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
