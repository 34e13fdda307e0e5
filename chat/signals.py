"""Signals: ephemeral `signal` frames (typing indicators and the like) relayed to a channel's other members.

A signal travels on the channel's `chat.<channel>` group, the fabric messages use, as a
`signal.sent` event; each connection that receives it sends it on unless it belongs to the
sender (the sender's own connections never hear their signals back). Nothing is stored and a
resume brings none back: a signal missed while away is simply gone.

Refused, with an `error` frame and nothing relayed: a channel the sender is not a member of
(`not_a_member`), more than `SIGNALS_PER_SECOND` on one connection in one channel
(`rate_limited`, with `retry_after_ms`), and a channel of more members than its environment's
`signal_max_members` (`signals_disabled`: a typing indicator is noise to a crowd).

An invisible sender's signals are dropped without an error: they look offline to the other
members, and a typing indicator would give them away; their client, told nothing, behaves as
it always does (docs/contract.md, "Extensions: signals and paged presence").
"""

import logging

from channels.db import database_sync_to_async
from django.db.models import Count, Exists
from limits import RateLimitItemPerSecond

from chat.handlers import chat_group
from presence.models import UserStatus
from relay import registry
from relay.exceptions import FrameError
from relay.frames import Signal, SignalSend
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.models import Channel
from relay.rate_limits import ConnectionLimit
from relay.registry import Connection

logger = logging.getLogger(__name__)

SIGNALS_PER_SECOND = ConnectionLimit("signals", RateLimitItemPerSecond(2))
RATE_MESSAGE = f"at most {SIGNALS_PER_SECOND.item.amount} signals a second in one channel; this one was dropped"


def channel_size(channel_id: str, sender_pk: int) -> tuple[int, int, bool]:
    """The channel's member count, its environment's `signal_max_members` and whether the
    sender is invisible, in one query."""
    invisible = UserStatus.objects.filter(user_id=sender_pk, invisible=True)
    return (
        Channel.objects.filter(id=channel_id)
        .annotate(member_count=Count("memberships"), sender_invisible=Exists(invisible))
        .values_list("member_count", "environment__signal_max_members", "sender_invisible")
        .get()
    )


read_channel_size = database_sync_to_async(channel_size)

registry.sends("signal", Signal, relays=True)


class SignalCounts(registry.Extension):
    """Forgets a connection's signal counts once they cannot be used again.

    The limiter's in-memory storage keeps a key for every (connection, channel) it ever counted,
    emptied but never dropped when its window passes: without this, each closed connection that
    signalled would stay in it for the life of the process.
    """

    async def channel_removed(self, conn: Connection, channel_id: str) -> None:
        SIGNALS_PER_SECOND.forget(conn.connection_id, channel_id)

    async def closed(self, conn: Connection) -> None:
        # Every channel it could have signalled in: one it left was forgotten as it left.
        for channel_id in conn.channel_ids:
            SIGNALS_PER_SECOND.forget(conn.connection_id, channel_id)


registry.extension(SignalCounts())


@registry.frame("signal", SignalSend)
async def signal(conn: Connection, payload: SignalSend) -> None:
    """Relay the signal to the channel's other members, if the sender may send it now."""
    channel_id = payload.channel
    if channel_id not in conn.channel_ids:
        raise FrameError("not_a_member", "you are not a member of that channel")
    SIGNALS_PER_SECOND.check("signal", RATE_MESSAGE, conn.connection_id, channel_id)
    members, most, invisible = await read_channel_size(channel_id, conn.user.pk)
    if members > most:
        raise FrameError("signals_disabled", f"signals are off in channels of more than {most} members")
    if invisible:
        return
    event = {"type": "signal.sent", "channel": channel_id, "user": conn.user_id, "name": payload.name}
    await channel_layer().group_send(chat_group(channel_id), {**event, "data": payload.data or {}})


@registry.event("signal.sent")
async def signal_sent(conn: Connection, event: dict) -> None:
    """A member signalled in one of the connection's channels: send it on, unless it is the sender's own."""
    try:
        frame = Signal(channel=str(event["channel"]), user=str(event["user"]), name=event["name"], data=event["data"])
    except KeyError:
        log_event(logger, Event.SIGNAL_INVALID_EVENT, logging.ERROR, connection_id=conn.connection_id)
        return
    # A removed member stops hearing the channel at once, even events already queued for it.
    if frame["channel"] not in conn.channel_ids or frame["user"] == conn.user_id:
        return
    await conn.send_frame("signal", frame)
