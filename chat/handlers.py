"""Chat on the WebSocket: `message.send`, live `message.created` fan-out, and resume.

Messages travel on their own channel-layer groups, `chat.<channel uuid>`, and
only ever as `message.created` events; presence has its own groups and event types.
A connection joins one group per channel for each fabric, so neither can deliver the
other's payload. Only the channel layer (RELAY_REDIS_URL) and the database are on
this path: presence's Redis being down does not stop a message.

Resume (`cursor` in the query string): for each channel named in it, the missed
messages are sent from the database in seq order, then live ones. Live events of a
channel being backfilled are held and sent after it, minus those the backfill
already sent, so the client sees no gap and no duplicate.

A cursor too long for a URL (Daphne refuses request heads over 16 KB) comes instead as the
connection's first frame, `resume`, the connection opened with `resume=frame`: every channel's
live events are held from the ack until that frame says which channels to backfill.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.db import DatabaseError

from chat.actions import send_message
from chat.exceptions import NotAMember
from chat.queries import PAGE_SIZE, last_seq, messages_after
from relay import close_codes, metrics, registry
from relay.exceptions import FrameError
from relay.frames import MessageAck, MessageCreated, MessageSend, Resume, parse_cursor
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.registry import Connection

logger = logging.getLogger(__name__)

STATE_KEY = "chat"
CURSOR_PARAMETER = "cursor"
# `resume=frame`: the cursor follows as the first frame.
RESUME_PARAMETER = "resume"
# The fields of a `message.created` frame: the wire payload is rebuilt from exactly
# these, so nothing else that travels on the fabric can reach a client.
CREATED_FIELDS = ("id", "channel", "seq", "user", "text", "created_at")

store_message = database_sync_to_async(send_message)
read_last_seq = database_sync_to_async(last_seq)
read_page = database_sync_to_async(messages_after)


def chat_group(channel_id: str) -> str:
    """The channel-layer group of one channel's messages (never the presence group's name)."""
    return f"chat.{channel_id}"


@dataclass
class ChatState:
    """One connection's message delivery state (kept in `conn.state["chat"]`)."""

    # channel -> the highest seq the resume covered; a live event at or below it
    # was either sent by the backfill or already seen by the client.
    floors: dict[str, int] = field(default_factory=dict)
    # channel -> live events that arrived while its backfill was running.
    held: dict[str, list[dict]] = field(default_factory=dict)
    backfill: asyncio.Task | None = None
    # Opened with `resume=frame` and that frame not yet received: every channel's live events held.
    awaiting_resume: bool = False


registry.sends("message.ack", MessageAck)
registry.sends("message.created", MessageCreated)


# ── the client sends ─────────────────────────────────────────────────────────
@registry.frame("message.send", MessageSend)
async def message_send(conn: Connection, payload: MessageSend) -> None:
    """Store the message, acknowledge it to the sender, then fan it out to the channel's members."""
    started = time.perf_counter()
    try:
        result = await store_message(conn.user, payload.channel, payload.idem_key, payload.text)
    except NotAMember:
        raise FrameError("not_a_member", "you are not a member of that channel") from None
    except DatabaseError as error:
        log_event(logger, Event.MESSAGE_FAILED, logging.ERROR, user=conn.user_id, error=type(error).__name__)
        raise FrameError("unavailable", "the message was not stored; send it again with the same idem_key") from None
    await conn.send_frame("message.ack", result.ack)
    metrics.MESSAGE_SEND_SECONDS.observe(time.perf_counter() - started)
    if not result.created:
        return
    seq = result.message["seq"]
    log_event(logger, Event.MESSAGE_STORED, user=conn.user_id, channel=payload.channel, seq=seq)
    try:
        await channel_layer().group_send(
            chat_group(payload.channel), {"type": "message.created", "message": result.message}
        )
    except Exception as error:
        # Stored and acknowledged: members that missed the live frame get it from a
        # resume or the history API, so a channel-layer fault loses nothing durable.
        log_event(
            logger,
            Event.MESSAGE_FANOUT_FAILED,
            logging.ERROR,
            channel=payload.channel,
            seq=seq,
            error=type(error).__name__,
        )


@registry.frame("resume", Resume)
async def resume(conn: Connection, payload: Resume) -> None:
    """The cursor of a connection opened with `resume=frame`: backfill its channels, release the others."""
    chat: ChatState = conn.state[STATE_KEY]
    if not chat.awaiting_resume:
        raise FrameError("invalid_frame", "resume is only the first frame of a connection opened with resume=frame")
    chat.awaiting_resume = False
    positions = {channel_id: seen for channel_id, seen in payload.cursor.items() if channel_id in conn.channel_ids}
    # Channels without a position have nothing to backfill: their held events go out now, in order.
    for channel_id in sorted(set(chat.held) - set(positions)):
        for message in sorted(chat.held.pop(channel_id), key=lambda message: message["seq"]):
            await conn.send_frame("message.created", message)
    start_backfill(conn, chat, positions)


def start_backfill(conn: Connection, chat: ChatState, positions: dict[str, int]) -> None:
    """Hold each channel's live events and backfill it after its position, in its own task."""
    for channel_id in positions:
        chat.held.setdefault(channel_id, [])
    chat.backfill = asyncio.create_task(backfill(conn, chat, positions))


# ── the channel layer delivers ───────────────────────────────────────────────
@registry.event("message.created")
async def message_created(conn: Connection, event: dict) -> None:
    """A message was stored in one of the connection's channels: send it, hold it, or drop a copy."""
    try:
        message = MessageCreated(**{key: event["message"][key] for key in CREATED_FIELDS})
        channel_id, seq = str(message["channel"]), int(message["seq"])
    except (KeyError, TypeError, ValueError):
        log_event(logger, Event.MESSAGE_INVALID_EVENT, logging.ERROR, connection_id=conn.connection_id)
        return
    # A removed member stops receiving at once, even events already queued for it.
    if channel_id not in conn.channel_ids:
        return
    chat: ChatState = conn.state[STATE_KEY]
    held = chat.held.get(channel_id)
    if held is not None:
        held.append(message)
        return
    if seq <= chat.floors.get(channel_id, 0):
        return
    await conn.send_frame("message.created", message)


# ── connection hooks ─────────────────────────────────────────────────────────
class ChatExtension(registry.Extension):
    """Names the `chat.<channel>` groups and runs a connection's resume."""

    # After presence's hooks, so `presence.snapshot` goes out right after
    # `connection.ack` and the backfill starts behind it.
    order = 200

    def group(self, channel_id: str) -> str:
        # Joined before anything is read (the consumer does it before `admit`), so no message
        # falls between a resume's read and the live ones.
        return chat_group(channel_id)

    async def admit(self, conn: Connection) -> None:
        conn.state[STATE_KEY] = ChatState()

    async def opened(self, conn: Connection) -> None:
        """Start the resume the `cursor` asks for, in its own task, so no other frame waits for it."""
        chat: ChatState = conn.state[STATE_KEY]
        if conn.query.get(RESUME_PARAMETER) == ["frame"]:
            # Held from now: nothing live may overtake the backfill the first frame will ask for.
            chat.awaiting_resume = True
            chat.held = {channel_id: [] for channel_id in conn.channel_ids}
            return
        raw = conn.query.get(CURSOR_PARAMETER)
        if raw is None:
            return
        try:
            if len(raw) != 1:
                raise ValueError("give one cursor parameter")
            positions = parse_cursor(raw[0])
        except ValueError as error:
            await conn.send_error("invalid_cursor", f"cursor: {error}; nothing was resumed")
            return
        # Channels the user is not a member of (unknown, another tenant's, or left while
        # away) are skipped without a word: there is nothing of theirs to resume, and an
        # answer must not tell one case from another.
        positions = {channel_id: seen for channel_id, seen in positions.items() if channel_id in conn.channel_ids}
        start_backfill(conn, chat, positions)

    async def closed(self, conn: Connection) -> None:
        """Stop the resume (the consumer leaves the groups)."""
        backfill_task = conn.state[STATE_KEY].backfill
        if backfill_task is not None:
            backfill_task.cancel()

    async def channel_removed(self, conn: Connection, channel_id: str) -> None:
        """Stop delivering the channel's messages at once, held ones included."""
        conn.state[STATE_KEY].held.pop(channel_id, None)


registry.extension(ChatExtension())


async def backfill(conn: Connection, chat: ChatState, positions: dict[str, int]) -> None:
    """Send every message after each channel's position, then the live ones held meanwhile."""
    sent = 0
    try:
        for channel_id, seen in sorted(positions.items()):
            sent += await resume_channel(conn, chat, channel_id, seen)
    except Exception as error:
        log_event(
            logger,
            Event.MESSAGE_RESUME_FAILED,
            logging.ERROR,
            connection_id=conn.connection_id,
            error=type(error).__name__,
        )
        await conn.send_error("resume_failed", "the resume failed; reconnect with the same cursor")
        await conn.close(code=close_codes.RESUME_FAILED)
        return
    log_event(
        logger,
        Event.MESSAGE_RESUMED,
        connection_id=conn.connection_id,
        user=conn.user_id,
        channels=len(positions),
        messages=sent,
    )


async def resume_channel(conn: Connection, chat: ChatState, channel_id: str, seen: int) -> int:
    """Backfill one channel after `seen`, release its held live events; return how many were backfilled."""
    # Read after the group was joined (in `admit`): a message committed after this
    # read was published after the join, so it arrives live and is held. Commits are
    # in seq order (see chat.actions), so everything up to `top` is in the table.
    # (The layer's group_add returns once Redis confirmed the SUBSCRIBE, and the PUBLISH
    # it must catch can only follow a later commit.)
    top = await read_last_seq(channel_id)
    # A position beyond the channel's last seq (a client's stale or foreign cursor)
    # must not swallow the live messages that come next.
    after = min(seen, top)
    sent = 0
    while after < top and channel_id in conn.channel_ids:
        page = await read_page(channel_id, after, PAGE_SIZE, top)
        if not page:
            break
        for message in page:
            if channel_id not in conn.channel_ids:
                break
            await conn.send_frame("message.created", message)
            sent += 1
        after = page[-1]["seq"]
    chat.floors[channel_id] = top
    held = chat.held.get(channel_id, [])
    # Events keep arriving while these sends await; each round drains what came in.
    # The list leaves `held` only once it is empty, with no await in between, so a
    # live event is either in a round or passes straight through afterwards.
    while held:
        batch = sorted(held, key=lambda message: message["seq"])
        held.clear()
        for message in batch:
            if message["seq"] > top and channel_id in conn.channel_ids:
                await conn.send_frame("message.created", message)
    chat.held.pop(channel_id, None)
    return sent
