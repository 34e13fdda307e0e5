"""Who handles what on a connection: each app registers its own frames, events and hooks.

The consumer looks a client frame's `type` up in `frames`, a channel-layer event's
`type` up in `events`, and calls every `Extension` at the points of a connection's
life. An app adds a frame family by registering here from its `AppConfig.ready`;
nothing in the consumer needs editing (seed 000: "one family, one owning module").
"""

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from relay.consumers import GatewayConsumer
    from relay.models import User

FrameHandler = Callable[["GatewayConsumer", Any], Awaitable[None]]
EventHandler = Callable[["GatewayConsumer", dict], Awaitable[None]]


@dataclass(frozen=True)
class FrameRoute:
    """A client frame type: its payload schema, its handler and the error code for a bad payload."""

    schema: type[BaseModel]
    handler: FrameHandler
    error_code: str


frames: dict[str, FrameRoute] = {}
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

    def load(self, sessions: Sequence[tuple["User", frozenset[str]]]) -> Sequence[Any]:
        """Before admit, SYNC, inside the connects' shared database hop: read what the hooks need.

        `sessions` are the (user, channel ids) of every connect in the hop; return one result
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

    async def admit(self, conn: "GatewayConsumer") -> None:
        """Before accept, the groups joined: check limits. Raise ConnectionRefused to refuse."""

    async def opened(self, conn: "GatewayConsumer") -> None:
        """After `connection.ack` was sent."""

    async def closed(self, conn: "GatewayConsumer") -> None:
        """After the connection ended however it did (closed, crashed, cancelled, shut down), if admitted."""

    async def channel_added(self, conn: "GatewayConsumer", channel_id: str) -> None:
        """The connection's user became a member of `channel_id`."""

    async def channel_removed(self, conn: "GatewayConsumer", channel_id: str) -> None:
        """The connection's user stopped being a member of `channel_id`."""


def frame(frame_type: str, schema: type[BaseModel], *, error_code: str = "invalid_frame") -> Callable:
    """Register the decorated coroutine as the handler of client frames of `frame_type`."""

    def register(handler: FrameHandler) -> FrameHandler:
        if frame_type in frames:
            raise RuntimeError(f"frame type {frame_type!r} is already handled by {frames[frame_type].handler}")
        frames[frame_type] = FrameRoute(schema=schema, handler=handler, error_code=error_code)
        return handler

    return register


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
