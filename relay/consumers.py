"""The WebSocket consumer at /v1/ws: authenticate, acknowledge, dispatch frames to the apps.

It owns only the connection's life and the wire; what a frame or event means
belongs to the app that registered it in `relay.registry`.
"""

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

import orjson
from autobahn.exception import Disconnected
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from pydantic import ValidationError

from relay import close_codes, membership, metrics, rate_limits, reconcile, registry
from relay.connect_reads import ConnectRead, log_hook_failure, read_channel_ids, read_connect
from relay.exceptions import ConnectionRefused, FrameError, InvalidToken, OutputBacklogFull
from relay.frames import ConnectionAck, Envelope, ErrorPayload, describe_validation_error
from relay.logging import Event, log_event
from relay.models import User
from relay.transport.channels_dispatch import DispatchWithoutCleanup
from relay.transport.inbound_backpressure import UNREAD_MS

logger = logging.getLogger(__name__)

# What sending on a socket the client closed raises: Daphne (autobahn) its Disconnected, servers
# following ASGI 2.4 an OSError.
SOCKET_GONE = (Disconnected, OSError)


# Releases in flight (GatewayConsumer._end), held so a shielded task is not collected mid-way.
_releases: set[asyncio.Future] = set()


class GatewayConsumer(DispatchWithoutCleanup, AsyncWebsocketConsumer):
    """One client connection: what the apps may use of it is `relay.registry.Connection`."""

    # Until `connect` sets them: a consumer can end before it ever connected (see `__call__`).
    user: User | None = None
    admitted: list[registry.Extension] = []  # never appended to: connect gives each connection its own
    is_open = False
    ended = False
    # Cut loose for reading too slowly: nothing more is sent to it.
    slow = False
    # Its token's secret was rotated away (relay/reconcile.py): closing with 4401, nothing more sent.
    revoked = False
    # Over its frame rate: every frame is refused until this time.monotonic().
    refused_until = 0.0
    # Until Channels names it: the layer may fail to give the consumer a channel at all.
    channel_name: str | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """Run the connection; however it ends, `_end` releases it, once."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Every way out passes here: the socket closed (websocket_disconnect stops the consumer),
            # an exception escaping a handler (Daphne closes the socket 1011), Daphne cancelling the
            # application `application_close_timeout` after its client left (a handler still waiting
            # on the database, say), or the instance shutting down.
            await self._end()

    async def connect(self) -> None:
        """Authenticate, join the user's groups, let every app admit the connection, then accept and ack."""
        self.connection_id = uuid.uuid4().hex
        self.frame_limit = rate_limits.frames()
        self.admitted: list[registry.Extension] = []
        self.state: dict[str, Any] = {}
        self.query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.loaded: dict[registry.Extension, Any] = {}
        since = await self._follow_memberships()
        if (read := await self._authenticate()) is None:
            return await self._refuse(close_codes.UNAUTHORIZED)
        await self._take(read, since)
        try:
            await self._admit()
        except ConnectionRefused as refusal:
            await self._end()
            return await self._refuse(refusal.code)
        await self._open()

    async def _follow_memberships(self) -> object:
        """Join the membership bus and reconciler (once per process); the bus's mark from before the read."""
        # Marked BEFORE the channels are read: a change made in between is then replayed to this
        # connection (and applied after connect) instead of lost, which would leave it in a
        # channel it was removed from until it reconnects.
        self.bus = membership.bus()
        self.applied = membership.Applied()
        await self.bus.start()
        self.reconciler = reconcile.reconciler()
        await self.reconciler.start()
        return self.bus.mark()

    async def _authenticate(self) -> ConnectRead | None:
        """The connect's read (user, channels, every app's `load`); None when the token is refused."""
        try:
            # Popped: no hook needs the token after this, and an idle connection need not keep it.
            return await read_connect(self.query.pop("token", [None])[0], registry.extensions)
        except InvalidToken:
            return None

    async def _refuse(self, code: int) -> None:
        """Accept, then close with `code`: a browser only ever sees a refused handshake as 1006."""
        metrics.REFUSED.labels(code=str(code)).inc()
        await self.accept()
        await self.close(code=code)

    async def _take(self, read: ConnectRead, since: object) -> None:
        """Keep what the read found, catch up with the bus, and join every app's groups of the channels."""
        self.user, self.channel_ids, self.loaded = read.user, read.channel_ids, read.loaded
        self.environment_id = str(self.user.environment_id)
        self.user_id = self.user.external_id
        # The secret this connection's token was verified with: a rotation away from it revokes it.
        self.secret_version = reconcile.secret_version(self.user.environment)
        if not self.bus.listen(self.user.pk, self.channel_name, since):
            # More changes than the bus remembers came by during the read: read again.
            self.channel_ids = await read_channel_ids(self.user)
        # Every app's groups, before any admit reads anything (registry.Extension.group).
        for ext in registry.extensions:
            ext.joining(self)
        await self.channel_layer.group_add_many(self._groups(self.channel_ids), self.channel_name)

    async def _admit(self) -> None:
        """Each app's `admit`, in order; ConnectionRefused from any of them refuses the connection."""
        for ext in registry.extensions:
            await ext.admit(self)
            self.admitted.append(ext)

    async def _open(self) -> None:
        """Accept, send `connection.ack`, then every admitted app's `opened`."""
        await self.accept()
        self.is_open = True
        self.reconciler.add(self)
        metrics.CONNECTS.inc()
        metrics.CONNECTIONS_OPEN.inc()
        log_event(logger, Event.CONNECTION_OPENED, connection_id=self.connection_id, user=self.user_id)
        ack = ConnectionAck(connection_id=self.connection_id, user=self.user_id, channels=sorted(self.channel_ids))
        await self.send_frame("connection.ack", ack)
        for ext in self.admitted:
            await self._guarded(ext.opened, "opened")
        # The loads served admit and opened; kept, they would cost every idle connection their size.
        self.loaded = {}

    async def _end(self) -> None:
        """Release the connection, the first time only: its groups, its bus listener, every app's `closed`."""
        if self.ended:
            return
        self.ended = True
        task = asyncio.ensure_future(self._release_all())
        # Shielded, and held until done: Daphne cancels an application again every second until it
        # has finished, and a release cut short would leave the user online and holding a slot.
        _releases.add(task)
        task.add_done_callback(_releases.discard)
        await asyncio.shield(task)

    async def _release_all(self) -> None:
        try:
            if self.is_open:
                self.reconciler.discard(self)
            if self.user is not None:
                self.bus.forget(self.user.pk, self.channel_name)
                await self._leave_groups()
            await self._release()
            if self.is_open:
                self.is_open = False
                metrics.CLOSES.inc()
                metrics.CONNECTIONS_OPEN.dec()
                log_event(logger, Event.CONNECTION_CLOSED, connection_id=self.connection_id, user=self.user_id)
        finally:
            # The layer forgets the channel only if a receive was still waiting on it when the
            # consumer stopped; one that had just returned a message would keep its queue forever.
            if self.channel_name is not None:
                self.channel_layer.discard_channel(self.channel_name)

    def _groups(self, channel_ids: Iterable[str]) -> list[str]:
        """Every extension's group of each of `channel_ids`."""
        return [
            group
            for channel_id in sorted(channel_ids)
            for ext in registry.extensions
            if (group := ext.group(channel_id)) is not None
        ]

    async def _leave_groups(self) -> None:
        with contextlib.suppress(Exception):
            # Redis away: the subscriptions go with the process's pub/sub connection anyway, and
            # the apps' close hooks that follow must still run.
            await self.channel_layer.group_discard_many(self._groups(self.channel_ids), self.channel_name)

    async def _release(self) -> None:
        for ext in reversed(self.admitted):
            await self._guarded(ext.closed, "closed")
        self.admitted = []

    async def _guarded(self, hook: Any, name: str, *args: Any) -> None:
        # One app's failure must not take the connection, or another app, down with it.
        try:
            await hook(self, *args)
        except Exception as error:
            log_hook_failure(f"{type(hook.__self__).__name__}.{name}", error)

    # ── frames from the client ───────────────────────────────────────────────
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """One client frame, read and handed to the app that owns its type. Nothing it raises ends the connection.

        The size is Daphne's to enforce (1 MiB of bytes per message and per frame, closed 1009
        before the frame is buffered), so a frame that gets here is within it.
        """
        if (wait := self._refused_for()) is not None:
            # Before anything is parsed or read: the excess costs the instance one error frame, and
            # the socket is not read until the wait has passed, so a flood waits in the client's
            # own buffers instead of costing the instance a refusal per frame.
            await self.send_error("rate_limited", "too many frames; slow down", retry_after_ms=wait, unread_ms=wait)
            return
        frame_type = None
        try:
            route, frame_type, payload = self._read(text_data)
            await route.handler(self, payload)
        except FrameError as error:
            await self.send_error(
                error.code, error.message, error.frame_type or frame_type, retry_after_ms=error.retry_after_ms
            )
        except Exception as error:
            # One line, by type only: an exception's text may quote what the client sent. The
            # traceback, which may too, only where DEBUG is on.
            log_event(logger, Event.FRAME_FAILED, logging.ERROR, type=frame_type, error=type(error).__name__)
            logger.debug("frame.failed: traceback", exc_info=error)
            await self.send_error("internal", "the server failed to handle this frame", frame_type)

    def _refused_for(self) -> int | None:
        """None when this frame is within the connection's rate; else the ms until the next one is taken.

        Going over the rate refuses every frame for at least `rate_limits.FRAME_PENALTY_MS`.
        """
        now = time.monotonic()
        if now < self.refused_until:
            return math.ceil((self.refused_until - now) * 1000)
        if (wait := self.frame_limit.refused(self.connection_id)) is None:
            return None
        wait = max(wait, rate_limits.FRAME_PENALTY_MS)
        self.refused_until = now + wait / 1000
        return wait

    def _read(self, text_data: str | None) -> tuple[registry.FrameRoute, str, Any]:
        """The route, type and validated payload of a frame; FrameError (`invalid_frame`...) when it is malformed."""
        if text_data is None:
            raise FrameError("invalid_frame", "frames are JSON text messages, not binary")
        try:
            # orjson, not json: strict JSON (no NaN or Infinity), nesting cut at 1,024 levels, no lone
            # surrogates, no integer of thousands of digits. json.loads let each through, or raised
            # something other than a decode error for it, and a frame could end the connection.
            data = orjson.loads(text_data)
        except orjson.JSONDecodeError:
            raise FrameError("invalid_frame", "frame is not valid JSON") from None
        try:
            envelope = Envelope.model_validate(data)
        except ValidationError as error:
            # A payload that is not an object still names a type the client can match its error to.
            known = data.get("type") if isinstance(data, dict) else None
            named = known if isinstance(known, str) and known in registry.frames else None
            raise FrameError("invalid_frame", describe_validation_error(error), named) from None
        route = registry.frames.get(envelope.type)
        # Only registered types become label values, so a client cannot grow the series.
        metrics.FRAMES_IN.labels(type=envelope.type if route else "unknown").inc()
        if route is None:
            raise FrameError("invalid_frame", f"unknown frame type {envelope.type!r}", envelope.type)
        try:
            payload = route.schema.model_validate(envelope.payload)
        except ValidationError as error:
            raise FrameError(route.error_code, describe_validation_error(error), envelope.type) from None
        return route, envelope.type, payload

    # ── events from the channel layer ────────────────────────────────────────
    async def dispatch(self, message: dict) -> None:
        message_type = message.get("type", "")
        if message_type.startswith("websocket."):
            await self._dispatch(message_type, message)
            return
        try:
            # A connection refused after it joined its groups (an app's `admit`) can have taken an
            # event off the layer while connecting: no app admitted it, so no handler may see it.
            if self.is_open:
                await self._dispatch(message_type, message)
        finally:
            # Every other message came from the channel layer: counted off its backlog once handled,
            # so a handler that writes past the queue (presence's fan-out) never overtakes it.
            self.channel_layer.handled(self.channel_name)

    async def _dispatch(self, message_type: str, message: dict) -> None:
        handler = registry.events.get(message_type)
        if handler is not None:
            await handler(self, message)
        else:
            await super().dispatch(message)

    async def websocket_disconnect(self, message: dict) -> None:
        """The socket closed: the consumer stops, and `__call__` releases it."""
        raise StopConsumer()

    async def membership_changed(self, event: dict) -> None:
        """The user joined or left a channel: keep `channel_ids` and every app's groups current."""
        if self.applied.notice(event["channel"], event["member"], event["version"]):
            await self._apply_membership(event["channel"], event["member"])

    async def _apply_membership(self, channel_id: str, member: bool) -> None:
        if member and channel_id not in self.channel_ids:
            self.channel_ids.add(channel_id)
            await self.channel_layer.group_add_many(self._groups([channel_id]), self.channel_name)
            for ext in self.admitted:
                await self._guarded(ext.channel_added, "channel_added", channel_id)
        elif not member and channel_id in self.channel_ids:
            # Out of `channel_ids` first: every app drops the channel's events from here on, even
            # those already queued for this connection.
            self.channel_ids.discard(channel_id)
            await self.channel_layer.group_discard_many(self._groups([channel_id]), self.channel_name)
            for ext in self.admitted:
                await self._guarded(ext.channel_removed, "channel_removed", channel_id)

    async def membership_sync(self, event: dict) -> None:
        """The reconciliation read the user's channels (a change's notice may have been lost): apply the difference."""
        channels = self.applied.sync(set(event["channels"]), event["version"])
        if channels is None:
            return  # read before a read already applied
        added, removed = channels - self.channel_ids, self.channel_ids - channels
        for channel_id in sorted(removed):
            await self._apply_membership(channel_id, False)
        for channel_id in sorted(added):
            await self._apply_membership(channel_id, True)
        if added or removed:
            log_event(
                logger,
                Event.MEMBERSHIP_REPAIRED,
                connection_id=self.connection_id,
                user=self.user_id,
                added=len(added),
                removed=len(removed),
            )

    async def connection_revoke(self, event: dict) -> None:
        """The environment's token secret was rotated: close with 4401, as a refused token is."""
        self.revoked = True
        log_event(logger, Event.CONNECTION_REVOKED, connection_id=self.connection_id, user=self.user_id)
        with contextlib.suppress(*SOCKET_GONE):
            await self.close(code=close_codes.UNAUTHORIZED)

    # ── sending ──────────────────────────────────────────────────────────────
    async def send_frame(self, frame_type: str, payload: Mapping[str, Any], *, unread_ms: int | None = None) -> None:
        """Send one `{"type", "payload"}` frame; dropped once the connection is cut loose (slow reader, revoked).

        `unread_ms`: the socket is not read for that long after it (relay.transport.inbound_backpressure).
        """
        if self.slow or self.revoked:
            return
        metrics.frames_out(frame_type).inc()
        try:
            # The client may have closed while this frame was on its way (under load, a transition
            # can be dispatched before the websocket.disconnect queued behind it): the frame is
            # dropped, and the disconnect that follows ends the consumer as usual.
            with contextlib.suppress(*SOCKET_GONE):
                # orjson: the same compact JSON as json.dumps(separators=(",", ":")) at a fraction of the CPU.
                text = orjson.dumps({"type": frame_type, "payload": payload}).decode()
                message = {"type": "websocket.send", "text": text}
                if unread_ms:
                    message[UNREAD_MS] = unread_ms
                await self.base_send(message)
        except OutputBacklogFull as full:
            await self._cut_loose(full.pending_bytes)

    async def _cut_loose(self, pending_bytes: int) -> None:
        # Closed rather than left to catch up: its backlog is memory the instance holds for it
        # alone, and frames dropped from it would be a gap the client could not see. It follows
        # the normal path from here: the close ends the consumer, and the grace check decides.
        self.slow = True
        log_event(
            logger,
            Event.CONNECTION_SLOW,
            logging.WARNING,
            connection_id=self.connection_id,
            user=self.user_id,
            pending_bytes=pending_bytes,
        )
        with contextlib.suppress(*SOCKET_GONE):
            await self.close(code=close_codes.SLOW_READER)

    async def send_error(
        self,
        code: str,
        message: str,
        frame_type: str | None = None,
        *,
        retry_after_ms: int | None = None,
        unread_ms: int | None = None,
    ) -> None:
        """Send an `error` frame; the socket stays open (and unread for `unread_ms`, as `send_frame`'s)."""
        payload = ErrorPayload(code=code, message=message)
        if frame_type is not None:
            payload["type"] = frame_type
        if retry_after_ms is not None:
            payload["retry_after_ms"] = retry_after_ms
        await self.send_frame("error", payload, unread_ms=unread_ms)
