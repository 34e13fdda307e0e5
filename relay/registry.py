"""Who handles what on a connection: each app registers its own frames, events and hooks.

The consumer looks a client frame's `type` up in `frames`, a channel-layer event's
`type` up in `events`, and calls every `Extension` at the points of a connection's
life. An app adds a frame family by registering here from its `AppConfig.ready`;
nothing in the consumer needs editing: one family, one owning module.
`server_frames` names the payload type of every frame the server sends, for the
published JSON Schema of the frames (relay.schema).
"""

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from relay.frames import ConnectionAck, ErrorPayload
from relay.models import User


class Connection(Protocol):
    """What an app may use of a client connection (relay.consumers.GatewayConsumer is the one).

    Once admitted: `connection_id`, `user` (the model), `environment_id`, `user_id` (the
    tenant's id for the user), `channel_ids` (kept current by live membership changes),
    `channel_name` (its channel-layer name), `query` (the connect's query string, without the
    token), `loaded` (each extension's `load` result, until `opened` is done) and `state`, a
    dict in which each app keeps its own per-connection data.
    """

    connection_id: str
    user: User
    environment_id: str
    user_id: str
    channel_ids: set[str]
    channel_name: str
    query: dict[str, list[str]]
    loaded: dict["Extension", Any]
    state: dict[str, Any]

    async def send_frame(self, frame_type: str, payload: Mapping[str, Any]) -> None:
        """Send one `{"type", "payload"}` frame."""

    async def send_error(self, code: str, message: str, frame_type: str | None = None) -> None:
        """Send an `error` frame; the socket stays open."""

    async def close(self, code: int | None = None) -> None:
        """Close the socket with `code`."""


FrameHandler = Callable[[Connection, Any], Awaitable[None]]
EventHandler = Callable[[Connection, dict], Awaitable[None]]


@dataclass(frozen=True)
class FrameRoute:
    """A client frame type: its payload schema, its handler and the error code for a bad payload."""

    schema: type[BaseModel]
    handler: FrameHandler
    error_code: str


frames: dict[str, FrameRoute] = {}
server_frames: dict[str, type] = {}
# Types both ways: a client frame the server relays to others under the same type (`signal`).
relayed: set[str] = set()
events: dict[str, EventHandler] = {}
extensions: list["Extension"] = []


class Extension:
    """Hooks an app adds to every connection; override the ones you need.

    `admit` runs before the socket is accepted and may refuse it by raising
    `relay.exceptions.ConnectionRefused`; `load` runs before it, in the database hop that
    authenticates the connection (one thread hop per connect, whatever the apps need). Nothing
    is sent to the client before `connection.ack`, and channel-layer events wait until `opened` hooks are done.
    Extensions run in ascending `order`; `closed` runs in reverse.
    """

    order: int = 100

    def load(self, connects: Sequence[tuple[User, frozenset[str]]]) -> Sequence[Any]:
        """Before admit, SYNC, inside the connects' shared database hop: read what the hooks need.

        `connects` are the (user, channel ids) of every connect in the hop; return one result
        for each, in order (read them together: one query for the batch, not one per connect).
        A result is `conn.loaded[self]` during `admit` and `opened` (dropped after, so an idle
        connection does not keep it). Left alone, the extension costs the hop nothing.
        An exception is logged and leaves those connections' `conn.loaded` without this extension's entry.
        """
        return ()

    def group(self, channel_id: str) -> str | None:
        """The channel-layer group this extension's events of `channel_id` travel through, if any.

        The consumer joins the groups of every extension for all of the user's channels in one
        call before `admit` (so nothing published after it is missed: a snapshot or a backfill
        read in `admit`/`opened` converges with what arrives live), follows membership changes,
        and leaves them when the socket closes or is refused.
        """
        return None

    def joining(self, conn: Connection) -> None:
        """Just before the connection joins every extension's groups (SYNC): an extension that takes
        its groups' messages itself, not through the connection's queue, starts keeping them here."""

    async def admit(self, conn: Connection) -> None:
        """Before accept, the groups joined: check limits. Raise ConnectionRefused to refuse."""

    async def opened(self, conn: Connection) -> None:
        """After `connection.ack` was sent."""

    async def closed(self, conn: Connection) -> None:
        """After the connection ended however it did (closed, crashed, cancelled, shut down), if admitted."""

    async def channel_added(self, conn: Connection, channel_id: str) -> None:
        """The connection's user became a member of `channel_id`."""

    async def channel_removed(self, conn: Connection, channel_id: str) -> None:
        """The connection's user stopped being a member of `channel_id`."""


def frame(frame_type: str, schema: type[BaseModel], *, error_code: str = "invalid_frame") -> Callable:
    """Register the decorated coroutine as the handler of client frames of `frame_type`."""

    def register(handler: FrameHandler) -> FrameHandler:
        if frame_type in server_frames and frame_type not in relayed:
            raise RuntimeError(f"frame type {frame_type!r} is a server frame")
        if frame_type in frames:
            raise RuntimeError(f"frame type {frame_type!r} is already handled by {frames[frame_type].handler}")
        frames[frame_type] = FrameRoute(schema=schema, handler=handler, error_code=error_code)
        return handler

    return register


def sends(frame_type: str, payload: type, *, relays: bool = False) -> None:
    """Declare a frame type the server sends and its payload's type (a TypedDict of relay.frames).

    `relays`: the server sends it as the relay of a client frame of the same type, which the
    same app handles; any other type is one direction only.
    """
    if frame_type in server_frames or (frame_type in frames and not relays):
        raise RuntimeError(f"frame type {frame_type!r} is already declared")
    server_frames[frame_type] = payload
    if relays:
        relayed.add(frame_type)


# The consumer's own frames; every other is declared by the app that sends it.
sends("connection.ack", ConnectionAck)
sends("error", ErrorPayload)


def event(event_type: str) -> Callable:
    """Register the decorated coroutine as the handler of channel-layer events of `event_type`."""

    def register(handler: EventHandler) -> EventHandler:
        if event_type in events:
            raise RuntimeError(f"event type {event_type!r} is already handled by {events[event_type]}")
        events[event_type] = handler
        return handler

    return register


def extension(instance: Extension) -> Extension:
    """Register an extension instance for every connection."""
    extensions.append(instance)
    extensions.sort(key=lambda ext: ext.order)
    return instance
