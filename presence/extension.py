"""How presence plugs into every connection: the registry extension and the transition handler."""

import functools
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from presence import actions, delivery, reads
from presence.delivery import STATE_KEY
from presence.fabric import TRANSITION, Dedup, group_name, parse_transition
from relay import registry

if TYPE_CHECKING:
    from relay.consumers import GatewayConsumer
    from relay.models import User

# Who of the co-members was online at the election, read in its round trip; sent after the ack.
SNAPSHOT_KEY = "presence.snapshot"
# Whether this connection's election published its user's `online`.
ANNOUNCED_KEY = "presence.announced"


class PresenceExtension(registry.Extension):
    """Joins the presence groups, runs the election, sends the snapshot, arms the grace check."""

    # Early: the 4429 refusal comes before any other app does work for a connection it refuses,
    # and the snapshot directly follows the ack, ahead of a resume's backlog (contract section 3).
    order = 10

    def load(self, sessions: Sequence[tuple["User", frozenset[str]]]) -> list[list[str]]:
        """The co-members (and the user) whose presence each snapshot reports, in the connects' database hop."""
        return reads.co_member_ids_of(
            [(str(user.environment_id), user.external_id, channel_ids) for user, channel_ids in sessions]
        )

    def group(self, channel_id: str) -> str:
        # Joined by the consumer BEFORE the election (`admit`): the subject hears its own
        # `online`, and a watcher never misses a transition raced with its own connect (it is
        # queued behind the snapshot, whose read is in the election's round trip, after the join).
        return group_name(channel_id)

    async def admit(self, conn: "GatewayConsumer") -> None:
        dedup = conn.state[STATE_KEY] = Dedup()
        watch = conn.loaded.get(self)
        # The `online` this connection would publish is delivered to it by `opened`, not by the
        # fabric: its id is known before the election, so the copies that come back are dropped
        # as they are read, even before the election's reply (one per channel, if it wins).
        transition_id = str(uuid.uuid4())
        dedup.sent_ahead(transition_id, copies=len(conn.channel_ids))
        fanout = delivery.fanout()
        fanout.expect_own(conn, dedup)
        announced = False
        try:
            admitted = await actions.service().connect(conn, watch or (), transition_id)
            announced = admitted.announced is not None
        finally:
            if not announced:
                fanout.withdraw_own(dedup)
        if watch is not None:
            conn.state[SNAPSHOT_KEY] = sorted(admitted.online or [])
        conn.state[ANNOUNCED_KEY] = announced

    async def opened(self, conn: "GatewayConsumer") -> None:
        online = conn.state.pop(SNAPSHOT_KEY, None)
        if online is None:
            # The database hop could not read the co-members: read them (and their keys) now.
            online = await reads.snapshot(conn)
        await conn.send_frame("presence.snapshot", {"online": online})
        if conn.state.pop(ANNOUNCED_KEY, False):
            # The user's own `online`, which this connection published, is delivered to it here,
            # in the same write as the ack and the snapshot, rather than after a trip through
            # Redis and the channel layer; its copies on the fabric are dropped (see `admit`).
            await conn.send_frame("presence.changed", {"user": conn.user_id, "state": "online"})
        # Last: a transition written straight to the socket must come after the snapshot.
        delivery.fanout().live(conn)

    async def channel_added(self, conn: "GatewayConsumer", channel_id: str) -> None:
        await reads.announce_new_co_members(conn, channel_id)

    async def closed(self, conn: "GatewayConsumer") -> None:
        # Membership changes need nothing more: the consumer follows them with the groups, and the
        # service takes `conn.channel_ids`, the very set the consumer keeps current, brought up to
        # date again when the grace check decides (actions.Departure), so the user's own later
        # transitions go to the channels of now.
        delivery.fanout().gone(conn)
        await actions.service().disconnect(conn)


@registry.event(TRANSITION)
async def presence_transition(conn: "GatewayConsumer", message: dict) -> None:
    """A transition queued for this connection (on a layer without the process-wide fan-out, or
    behind what the connection had queued): delivered as `Fanout` delivers the others."""
    await delivery.deliver(conn, message, functools.partial(parse_transition, message))
