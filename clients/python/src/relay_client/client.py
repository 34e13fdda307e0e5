"""The Relay client: one user's connection, kept up across instance deaths, restarts and drops.

What the application sees: `online` (the presence view), and through `async for event in client`
every message of the user's channels exactly once and in seq order, every presence change, and
the errors that answered nothing it asked. The rules it follows are in docs/clients.md:

- Reconnect with jittered exponential back-off after anything but a refusal (4401, 4429); after a
  refusal only if the token callable gives a token other than the one refused.
- Per channel, deliver only the next seq; hold a later one. A held seq is a gap: wait `gap_wait`
  for the live frame that is merely late (two instances publish independently), then read the
  missing ones from the history endpoint with the connection token.
- Resume with the cursor of the highest contiguous seq delivered per channel, never the highest
  seen: what was held is sent again by the resume, and what was missing comes with it.
- Requests (`message.send`, `register`, `deregister`) stay pending until answered and go again,
  unchanged, on every new connection: the server answers a repeated `idem_key` or `register`
  with the first one's result, so each lands once.
- Rich presence: a status is the server's to keep (durable), so `set_status` goes again only
  while unanswered; idle belongs to a connection, so a client that said idle says it again on
  every new connection (each starts active).
"""

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import quote, urlsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, WebSocketException

from relay_client.events import (
    ClientFrame,
    ConnectionAck,
    Deregister,
    DeregisterAck,
    Disconnected,
    Error,
    Event,
    Heartbeat,
    MessageAck,
    MessageCreated,
    MessageSend,
    PresenceActivity,
    PresenceChanged,
    PresenceOccupancy,
    PresenceQuery,
    PresenceResult,
    PresenceSet,
    PresenceSnapshot,
    PresenceStatus,
    Reconnected,
    Register,
    RegisterAck,
    Signal,
    SignalSend,
    frame_text,
    parse_frame,
)
from relay_client.exceptions import (
    AgentRefused,
    ClientClosed,
    ConnectFailed,
    FrameRefused,
    HistoryUnavailable,
    IdentityMismatch,
    ProtocolError,
    RelayError,
    SendRefused,
    TooManyConnections,
    Unauthorized,
    UserChanged,
)
from relay_client.history import PAGE_SIZE, read_history

logger = logging.getLogger("relay_client")

TokenSource = str | Callable[[], str] | Callable[[], Awaitable[str]]

REFUSALS: dict[int, type[Unauthorized] | type[TooManyConnections]] = {4401: Unauthorized, 4429: TooManyConnections}
# The contract's bounds on `text`; checked here because a frame over 1 MiB is answered with a
# close (1009), and a pending send that goes again after every reconnect would loop on it.
MAX_TEXT_LENGTH = 16_384
MAX_SIGNAL_NAME_LENGTH = 32
MAX_SIGNAL_DATA_BYTES = 256
# The server's RELAY_AGENT_TTL_MS default, in seconds.
AGENT_TTL = 30.0
# A deregister of a row the server no longer holds (swept, or removed in admin) is answered with
# silence, so the wait for its ack is bounded.
DEREGISTER_WAIT = 5.0
# Frames are at most 1 MiB on the server's side; a message.created of 16,384 characters is far below.
MAX_FRAME_BYTES = 2**21
# Past this many bytes of cursor the URL would near the server's 16 KB request head: the cursor
# goes as the connection's first frame instead (`resume=frame`).
MAX_URL_CURSOR_BYTES = 4096

_END = object()


@dataclass
class _Request:
    """A frame waiting for its answer; it goes again on each new connection until it has one."""

    frame: ClientFrame
    future: asyncio.Future[Any]
    # (connection serial, order) of its last transmission: an `error` answers the oldest in flight.
    sent: tuple[int, int] | None = None


class Client:
    """One user's connection to Relay. See the module docstring and docs/clients.md."""

    def __init__(
        self,
        url: str,
        token: TokenSource,
        *,
        cursor: Mapping[str, int] | None = None,
        gap_wait: float = 0.5,
        open_timeout: float = 10.0,
        retry_base: float = 0.5,
        retry_cap: float = 30.0,
        stable_after: float = 30.0,
        device: str = "web",
    ) -> None:
        """`url`: the instance's base, `ws://host:port`. `token`: a str, or a (sync or async) callable
        called for a fresh token before every connection; a sync one runs in a worker thread.
        `cursor`: `{channel: last seq the application has}` to start from (default: each channel's
        whole history comes first). `gap_wait`: how long a skipped seq may be merely late before the
        history is read. `retry_base`/`retry_cap`: the reconnect back-off, in seconds; it starts again
        from `retry_base` only after a connection stayed up `stable_after` seconds (a server that
        acknowledges and then closes at once is retried ever more slowly, not every `retry_base`).
        `device`: this connection's kind for presence (`web`, `mobile`, `desktop` or `bot`)."""
        if device not in DEVICES:
            raise ValueError(f"device is one of {', '.join(DEVICES)}")
        self._device = device
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.netloc or parts.query:
            raise ValueError("url is the instance's base: ws://host:port or wss://host:port")
        self._url = url.rstrip("/")
        self._http_url = ("https" if parts.scheme == "wss" else "http") + self._url[len(parts.scheme) :]
        if not (isinstance(token, str) and token) and not callable(token):
            raise TypeError("token is a non-empty str or a callable returning one")
        self._token_source = token
        self._token = ""
        self._positions = {_channel_id(channel): _seq(seen) for channel, seen in (cursor or {}).items()}
        self._gap_wait = gap_wait
        self._open_timeout = open_timeout
        self._retry_base, self._retry_cap = retry_base, retry_cap
        self._stable_after = stable_after

        self._user: str | None = None
        self._channels: frozenset[str] = frozenset()
        self._connection_id: str | None = None
        self._online: set[str] = set()
        self._statuses: dict[str, dict[str, Any]] = {}
        self._own: PresenceStatus | None = None
        self._idle = False
        self._presence_lock = asyncio.Lock()
        self._held: dict[str, dict[int, MessageCreated]] = {}
        self._fills: dict[str, asyncio.Task[None]] = {}
        self._pending: dict[tuple[str, ...], _Request] = {}
        self._agents: dict[str, Agent] = {}
        self._background: set[asyncio.Future[None]] = set()
        self._events: asyncio.Queue[Any] = asyncio.Queue()

        self._ws: ClientConnection | None = None
        self._serial = 0  # counts connections; a task started for one checks it is still current
        self._live = False  # from connection.ack until the connection closes
        self._send_lock = asyncio.Lock()
        self._retrying = False  # requests refused `rate_limited` are to go again
        self._order = itertools.count()
        self._runner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None  # what connect() waits for
        self._was_ready = False  # the first connection's snapshot arrived
        self._closed = False
        self._failure: RelayError | None = None

    def __repr__(self) -> str:
        return f"<relay_client.Client {self._url} user={self._user!r} live={self._live}>"

    # ── the application's view ───────────────────────────────────────────────
    @property
    def online(self) -> frozenset[str]:
        """The user ids online among the user's co-members: the snapshot, then every change."""
        return frozenset(self._online)

    @property
    def statuses(self) -> dict[str, dict[str, Any]]:
        """The status of each online co-member (and the user): `{"status", "text", "emoji", "until", "idle"}`."""
        return {user: dict(status) for user, status in self._statuses.items()}

    @property
    def own_status(self) -> PresenceStatus | None:
        """The user's own status as the server last told it (with `invisible`), if it has."""
        return self._own

    @property
    def invisible(self) -> bool:
        """Whether the user is invisible, as the server last told this client."""
        return bool(self._own and self._own.invisible)

    @property
    def idle(self) -> bool:
        """Whether this client told the server its connection is idle."""
        return self._idle

    @property
    def user(self) -> str | None:
        """The connected user (from the first connection.ack)."""
        return self._user

    @property
    def channels(self) -> frozenset[str]:
        """The channel ids the latest connection.ack named."""
        return self._channels

    @property
    def connection_id(self) -> str | None:
        return self._connection_id

    @property
    def connected(self) -> bool:
        """Whether a connection is up (acknowledged and not closed)."""
        return self._live

    @property
    def cursor(self) -> dict[str, int]:
        """The highest contiguous seq delivered per channel: keep it to start a later client from it."""
        return dict(self._positions)

    # ── lifecycle ────────────────────────────────────────────────────────────
    async def connect(self) -> None:
        """Return once `connection.ack` and `presence.snapshot` arrived.

        Raises ConnectFailed when the first connection cannot be opened, Unauthorized (4401) or
        TooManyConnections (4429) when the server refuses and the token source gives no new token.
        """
        if self._runner is not None:
            raise RuntimeError("connect() was already called")
        ready = self._ready = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._run(), name=f"relay-client {self._url}")
        try:
            await asyncio.shield(ready)
        except asyncio.CancelledError:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the connection and stop reconnecting; pending requests raise ClientClosed."""
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self._finish(ClientClosed("the client was closed"))

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        """The next event, in order; the iteration ends at close() and raises what stopped the client."""
        event = await self._events.get()
        if event is _END:
            self._events.put_nowait(_END)
            if self._failure is not None:
                raise self._failure
            raise StopAsyncIteration
        return cast(Event, event)

    # ── requests ─────────────────────────────────────────────────────────────
    async def send(self, channel: str, text: str, idem_key: str | None = None) -> MessageAck:
        """Send a message; return its ack (`id`, `channel`, `seq`) once the server stored it.

        Sent again with the same `idem_key` after a reconnect until acknowledged, so it lands once.
        Raises SendRefused when the server refuses it (e.g. `not_a_member`).
        """
        if not 1 <= len(text) <= MAX_TEXT_LENGTH:
            raise ValueError(f"text is 1 to {MAX_TEXT_LENGTH} characters")
        frame = MessageSend(idem_key=idem_key or uuid.uuid4().hex, channel=_channel_id(channel), text=text)
        ack: MessageAck = await self._request(frame, (frame.channel, frame.idem_key))
        return ack

    async def set_status(self, **fields: Any) -> PresenceStatus:
        """Set any of `status`, `text`, `emoji`, `until` (a datetime or ISO-8601; None: no expiry) and
        `invisible`; return the user's status as the server answers it. Raises FrameRefused when the
        server refuses it (`forbidden`, `rate_limited`, `invalid_frame`)."""
        unknown = set(fields) - {"status", "text", "emoji", "until", "invisible"}
        if unknown or not fields:
            raise ValueError("give any of status, text, emoji, until, invisible")
        if isinstance(fields.get("until"), datetime):
            fields["until"] = fields["until"].isoformat()
        async with self._presence_lock:
            answer: PresenceStatus = await self._request(PresenceSet(**fields), ())
        return answer

    async def set_idle(self, idle: bool) -> None:
        """Tell the server this connection is idle (or active again); said again after a reconnect."""
        self._check_open()
        self._idle = idle
        await self._send_frame(PresenceActivity(idle=idle))

    async def query(self, users: Iterable[str]) -> dict[str, dict[str, Any]]:
        """State, last seen and status of `users` (1-100) who share a channel with this user; others are absent."""
        wanted = tuple(dict.fromkeys(users))
        if not 1 <= len(wanted) <= 100:
            raise ValueError("query 1 to 100 users")
        async with self._presence_lock:
            result: PresenceResult = await self._request(PresenceQuery(users=wanted), ())
        return result.users

    async def signal(self, channel: str, name: str, data: Mapping[str, Any] | None = None) -> None:
        """Signal the channel's other members (`name`, e.g. "typing"; `data`, a small JSON object).

        Fire and forget: nothing answers a signal that was relayed, and one sent while the client
        is reconnecting is dropped (signals are never stored). A refusal arrives as an `Error`
        event of type `signal`: `not_a_member`, `rate_limited` (more than 2 a second in one
        channel; `retry_after_ms` says when) or `signals_disabled` (a channel too large for them).
        """
        self._check_open()
        if not 1 <= len(name) <= MAX_SIGNAL_NAME_LENGTH:
            raise ValueError(f"name is 1 to {MAX_SIGNAL_NAME_LENGTH} characters")
        payload = dict(data or {})
        if len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()) > MAX_SIGNAL_DATA_BYTES:
            raise ValueError(f"data is at most {MAX_SIGNAL_DATA_BYTES} bytes as JSON")
        await self._send_frame(SignalSend(channel=_channel_id(channel), name=name, data=payload))

    def agent(
        self,
        instance: str,
        identity: str,
        capability: Mapping[str, str | float] | None = None,
        *,
        ttl: float = AGENT_TTL,
    ) -> "Agent":
        """`async with client.agent(...)`: register `instance`, heartbeat at ttl / 3, deregister on exit.

        `identity` must be the connected user: the server binds an instance to the user of the
        connection that registers it. `ttl` is the server's RELAY_AGENT_TTL_MS, in seconds.
        """
        return Agent(self, instance, identity, dict(capability or {}), ttl)

    async def _request(self, frame: ClientFrame, key: tuple[str, ...]) -> Any:
        self._check_open()
        key = (type(frame).__name__, *key)
        existing = self._pending.get(key)
        if existing is not None:
            return await asyncio.shield(existing.future)
        request = _Request(frame, asyncio.get_running_loop().create_future())
        self._pending[key] = request
        try:
            await self._transmit(request)
            return await request.future
        finally:
            if self._pending.get(key) is request:
                del self._pending[key]

    async def _transmit(self, request: _Request) -> None:
        """Send a request on the current connection, unless it is down or already carried it."""
        async with self._send_lock:
            ws = self._ws
            if not self._live or ws is None or request.future.done():
                return
            if request.sent is not None and request.sent[0] == self._serial:
                return
            request.sent = (self._serial, next(self._order))
            with contextlib.suppress(ConnectionClosed):
                await ws.send(frame_text(request.frame))

    async def _send_frame(self, frame: ClientFrame) -> None:
        """Send a frame that expects no answer, if a connection is up."""
        async with self._send_lock:
            if self._live and self._ws is not None:
                with contextlib.suppress(ConnectionClosed):
                    await self._ws.send(frame_text(frame))

    def _answer(self, key: tuple[str, ...], ack: Any) -> None:
        request = self._pending.get(key)
        if request is not None and not request.future.done():
            request.future.set_result(ack)

    def _refuse(self, error: Error) -> bool:
        """Fail the oldest request in flight of the error's type with it; False if none is."""
        in_flight = [
            request
            for request in self._pending.values()
            if _TYPES[type(request.frame)] == error.type
            and request.sent is not None
            and request.sent[0] == self._serial
            and not request.future.done()
        ]
        if not in_flight:
            return False
        request = min(in_flight, key=lambda request: request.sent or (0, 0))
        frame = request.frame
        refusal = (
            SendRefused(error, frame.idem_key)
            if isinstance(frame, MessageSend)
            else AgentRefused(error, frame.instance)
            if isinstance(frame, Register | Deregister)
            else FrameRefused(error)
        )
        request.future.set_exception(refusal)
        return True

    async def _send_again_after(self, serial: int, delay: float) -> None:
        """After `delay`, send every request the connection `serial` carried and has not answered again."""
        try:
            await asyncio.sleep(delay)
        finally:
            self._retrying = False
        if serial != self._serial:
            return  # a new connection sent them all already
        for request in list(self._pending.values()):
            if request.sent is not None and request.sent[0] == serial:
                request.sent = None
                await self._transmit(request)

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise ClientClosed("the client was closed")
        if self._runner is None:
            raise RuntimeError("call connect() first")

    # ── the connection loop ──────────────────────────────────────────────────
    async def _run(self) -> None:
        failures = 0
        refused: tuple[int, str] | None = None  # the close code and the token it refused
        try:
            while True:
                try:
                    token = await self._fresh_token()
                except Exception as error:
                    if not self._was_ready:
                        raise ConnectFailed(f"the token callable failed: {type(error).__name__}") from error
                    logger.warning("the token callable failed (%s)", type(error).__name__)
                    token = None
                if token is not None:
                    if refused is not None and token == refused[1]:
                        raise REFUSALS[refused[0]]()
                    refused = None
                    try:
                        code, stable = await self._session(token)
                    except (OSError, TimeoutError, WebSocketException, ProtocolError) as error:
                        if not self._was_ready:
                            raise ConnectFailed(f"{self._url}: {_describe(error)}") from error
                        logger.info("connecting to %s failed: %s", self._url, _describe(error))
                        code, stable = None, False
                    if stable:
                        failures = 0
                    if code in REFUSALS:
                        if isinstance(self._token_source, str):
                            raise REFUSALS[code]()
                        refused = (code, token)
                # Jittered, so the clients of a dead instance spread their returns over the survivors.
                ceiling = min(self._retry_cap, self._retry_base * 2 ** min(failures, 32))
                failures += 1
                await asyncio.sleep(ceiling / 2 + random.random() * ceiling / 2)
        except RelayError as error:
            self._failure = error
            self._finish(error)
        except Exception as error:
            # A bug here must not leave connect() or the iteration waiting forever.
            logger.exception("the connection loop failed")
            self._failure = RelayError(f"the client failed: {type(error).__name__}")
            self._finish(self._failure)

    async def _fresh_token(self) -> str:
        source = self._token_source
        if isinstance(source, str):
            token: Any = source
        elif inspect.iscoroutinefunction(source):
            token = await source()
        else:
            token = await asyncio.to_thread(source)
            if inspect.isawaitable(token):
                token = await token
        if not isinstance(token, str) or not token:
            raise TypeError("the token callable must return a non-empty str")
        self._token = token
        return token

    async def _session(self, token: str) -> tuple[int, bool]:
        """One connection: open it, read its frames until it closes; return (close code, stayed up).

        Stayed up: acknowledged, and open for `stable_after` seconds.
        """
        url = f"{self._url}/v1/ws?token={quote(token, safe='')}&device={self._device}"
        cursor = json.dumps(self._positions, separators=(",", ":")) if self._positions else None
        by_frame = cursor is not None and len(cursor) > MAX_URL_CURSOR_BYTES
        if by_frame:
            url += "&resume=frame"
        elif cursor is not None:
            url += "&cursor=" + quote(cursor, safe="")
        ws = await websockets.connect(url, open_timeout=self._open_timeout, close_timeout=5, max_size=MAX_FRAME_BYTES)
        self._serial += 1
        self._ws = ws
        acked = False
        acked_at = 0.0
        code = 1006
        loop = asyncio.get_running_loop()
        try:
            if by_frame:
                # First, before anything else this connection sends: the server holds live messages till then.
                await ws.send('{"type":"resume","payload":{"cursor":' + cursor + "}}")
            # The ack and the snapshot must come within the open timeout; after them, nothing is due.
            deadline = asyncio.get_running_loop().time() + self._open_timeout
            snapshotted = False
            while True:
                if snapshotted:
                    raw = await ws.recv()
                else:
                    try:
                        async with asyncio.timeout_at(deadline):
                            raw = await ws.recv()
                    except TimeoutError:
                        raise ProtocolError("no connection.ack and presence.snapshot in time") from None
                frame = _parse(raw)
                if frame is None:
                    continue
                if not acked:
                    if not isinstance(frame, ConnectionAck):
                        logger.warning("ignored a %s before connection.ack", type(frame).__name__)
                        continue
                    acked, acked_at = True, loop.time()
                    await self._on_ack(frame)
                    continue
                if isinstance(frame, PresenceSnapshot):
                    snapshotted = True
                await self._on_frame(frame)
        except ConnectionClosed:
            code = ws.close_code or 1006
            return code, acked and loop.time() - acked_at >= self._stable_after
        finally:
            self._live = False
            if self._ws is ws:
                self._ws = None
            await ws.close()
            if acked and not self._closed:
                self._on_disconnected(code)

    async def _on_ack(self, ack: ConnectionAck) -> None:
        if self._user is None:
            self._user = ack.user
        elif ack.user != self._user:
            raise UserChanged(self._user, ack.user)
        self._connection_id = ack.connection_id
        self._channels = frozenset(ack.channels)
        self._live = True
        if self._was_ready:
            self._emit(Reconnected(ack.connection_id))
        # A channel the cursor did not name (the first connection, or one joined while away): its
        # history comes from the endpoint, merged with the live messages as they arrive.
        for channel in ack.channels:
            if channel not in self._positions:
                self._positions[channel] = 0
                self._start_fill(channel, to_end=True, delay=0)
        if self._idle:
            await self._send_frame(PresenceActivity(idle=True))
        for request in list(self._pending.values()):
            await self._transmit(request)
        for agent in list(self._agents.values()):
            self._spawn(agent._reregister())

    async def _on_frame(self, frame: Any) -> None:
        match frame:
            case PresenceSnapshot():
                self._on_snapshot(frame)
            case PresenceChanged(user=user, state=state):
                if state == "online":
                    self._online.add(user)
                else:
                    self._online.discard(user)
                    self._statuses.pop(user, None)
                self._emit(frame)
            case PresenceStatus():
                self._statuses[frame.user] = {
                    "status": frame.status,
                    "text": frame.text,
                    "emoji": frame.emoji,
                    "until": frame.until,
                    "idle": frame.idle,
                }
                if frame.user == self._user and frame.invisible is not None:
                    self._own = frame
                    self._answer(("PresenceSet",), frame)
                self._emit(frame)
            case PresenceResult():
                self._answer(("PresenceQuery",), frame)
            case PresenceOccupancy():
                self._emit(frame)
            case MessageCreated():
                self._accept(frame)
            case MessageAck():
                self._answer(("MessageSend", frame.channel, frame.idem_key), frame)
            case RegisterAck():
                self._answer(("Register", frame.instance), frame)
            case DeregisterAck():
                self._answer(("Deregister", frame.instance), frame)
            case Signal():
                self._emit(frame)
            case Error(code="rate_limited", type=None):
                # The server names no frame here: every request in flight goes again once the wait
                # is over (each is idempotent; one that was answered meanwhile is skipped).
                if not self._retrying:
                    self._retrying = True
                    self._spawn(self._send_again_after(self._serial, (frame.retry_after_ms or 1000) / 1000))
            case Error():
                if not self._refuse(frame):
                    self._emit(frame)
            case ConnectionAck():
                logger.warning("ignored a second connection.ack")

    def _on_snapshot(self, snapshot: PresenceSnapshot) -> None:
        online = set(snapshot.online)
        self._statuses = {user: dict(status) for user, status in snapshot.status.items() if isinstance(status, dict)}
        if not self._was_ready:
            self._online = online
            self._was_ready = True
            if self._ready is not None:
                self._ready.set_result(None)
            return
        # After a reconnect the application hears what changed while it was away, as changes, so
        # one that applies every PresenceChanged in order holds what `online` holds.
        for user in sorted(online - self._online):
            self._emit(PresenceChanged(user=user, state="online"))
        for user in sorted(self._online - online):
            self._emit(PresenceChanged(user=user, state="offline"))
        self._online = online

    def _on_disconnected(self, code: int) -> None:
        self._emit(Disconnected(code))
        # The resume sends everything after the contiguous position again: what was held is
        # redundant, and a fill in progress would only race it.
        for task in self._fills.values():
            task.cancel()
        self._fills.clear()
        self._held.clear()

    # ── messages: in seq order, once ─────────────────────────────────────────
    def _accept(self, message: MessageCreated) -> None:
        """Deliver `message` if it is its channel's next seq (and whatever it unblocks), else hold it."""
        channel = message.channel
        position = self._positions.setdefault(channel, 0)
        if message.seq <= position:
            return
        held = self._held.setdefault(channel, {})
        if message.seq > position + 1:
            held.setdefault(message.seq, message)
            self._start_fill(channel, to_end=False, delay=self._gap_wait)
            return
        next_message: MessageCreated | None = message
        while next_message is not None:
            self._emit(next_message)
            position = next_message.seq
            next_message = held.pop(position + 1, None)
        self._positions[channel] = position
        if not held:
            del self._held[channel]

    def _start_fill(self, channel: str, *, to_end: bool, delay: float) -> None:
        running = self._fills.get(channel)
        if running is not None and not running.done():
            return  # it reads on until nothing is held
        self._fills[channel] = asyncio.create_task(self._fill(channel, to_end, delay))

    async def _fill(self, channel: str, to_end: bool, delay: float) -> None:
        """Read the channel's history after its position: to the newest (`to_end`), then while anything is held."""
        await asyncio.sleep(delay)
        serial = self._serial
        while to_end or self._held.get(channel):
            position = self._positions[channel]
            held = self._held.get(channel)
            limit = PAGE_SIZE if to_end or not held else min(PAGE_SIZE, min(held) - 1 - position)
            try:
                page = await read_history(self._http_url, self._token, channel, position, limit)
            except HistoryUnavailable as error:
                if error.status == 404:
                    # No longer a member: nothing more of this channel will come.
                    self._held.pop(channel, None)
                    return
                # The resume delivers the same messages: reconnecting is the fallback.
                logger.warning("%s; reconnecting to resume instead", error)
                if serial == self._serial and self._ws is not None:
                    await self._ws.close()
                return
            if serial != self._serial:
                return
            for message in page.messages:
                if message.channel == channel:
                    self._accept(message)
            if self._positions[channel] == position and (page.messages or self._held.get(channel)):
                logger.warning("the history does not continue from seq %d; left to a resume", position)
                return
            if page.next_after is None:
                to_end = False

    # ── plumbing ─────────────────────────────────────────────────────────────
    def _emit(self, event: Event) -> None:
        self._events.put_nowait(event)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _finish(self, error: RelayError) -> None:
        """Stop for good: fail whatever waits, end the iteration."""
        self._live = False
        for task in [*self._fills.values(), *self._background]:
            task.cancel()
        for agent in self._agents.values():
            agent._stop_heartbeat()
        for request in self._pending.values():
            if not request.future.done():
                request.future.set_exception(error)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
        self._events.put_nowait(_END)


class Agent:
    """A registered worker instance; made by `Client.agent`, used with `async with`."""

    def __init__(self, client: Client, instance: str, identity: str, capability: dict[str, str | float], ttl: float):
        if ttl <= 0:
            raise ValueError("ttl is the server's agent TTL in seconds, above 0")
        self.client = client
        self.instance = instance
        self.identity = identity
        self.capability = capability
        self.ttl = ttl
        self.registered_at: str | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        client = self.client
        client._check_open()
        if self.identity != client.user:
            raise IdentityMismatch(self.identity, client.user)
        if self.instance in client._agents:
            raise RuntimeError(f"{self.instance!r} is already registered by this client")
        ack: RegisterAck = await client._request(Register(self.instance, self.capability), (self.instance,))
        self.registered_at = ack.registered_at
        client._agents[self.instance] = self
        self._heartbeat = asyncio.create_task(self._beat())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        client = self.client
        client._agents.pop(self.instance, None)
        self._stop_heartbeat()
        if not client.connected:
            # The row stays until the server's sweep removes it, a TTL after the last heartbeat.
            return
        with contextlib.suppress(TimeoutError, ClientClosed, FrameRefused):
            await asyncio.wait_for(client._request(Deregister(self.instance), (self.instance,)), DEREGISTER_WAIT)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            await self.client._send_frame(Heartbeat(self.instance))

    async def _reregister(self) -> None:
        """Register again on a new connection (the row may be gone meanwhile); a refusal becomes an Error event."""
        try:
            ack: RegisterAck = await self.client._request(Register(self.instance, self.capability), (self.instance,))
        except AgentRefused as refusal:
            self.client._emit(refusal.error)
        except RelayError:
            return
        else:
            self.registered_at = ack.registered_at

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()


_TYPES = {
    MessageSend: "message.send",
    Register: "register",
    Deregister: "deregister",
    PresenceSet: "presence.set",
    PresenceQuery: "presence.query",
}
DEVICES = ("web", "mobile", "desktop", "bot")


def _parse(raw: str | bytes) -> Any:
    """The frame, or None (logged) for one this client cannot use: never a reason to drop the connection."""
    try:
        frame = parse_frame(raw)
    except ProtocolError as error:
        logger.warning("ignored a malformed frame: %s", error)
        return None
    if frame is None:
        logger.debug("ignored a frame of a type this client does not know")
    return frame


def _channel_id(channel: str) -> str:
    """A channel id in the server's canonical form (its acks and frames name channels so)."""
    try:
        return str(uuid.UUID(channel))
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{channel!r} is not a channel id (a UUID)") from None


def _seq(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("a cursor position is a whole number >= 0")
    return value


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
