"""Test support: the tenants, the sockets that record every frame, live instances, the waits and the clocks.

Two kinds of socket are read the same way (FrameRecorder): `Socket` talks to relay.asgi in this
process, `WsClient` is a real WebSocket client of a live instance. Multi-instance behaviour is
tested with several real Daphne processes on one real
Redis and one database file, with timings scaled down through the same environment variables an
operator sets. In one process, presence's time is a ManualClock and the registry's a FrozenClock.
"""

import abc
import asyncio
import contextlib
import heapq
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import psycopg
import pytest
import websockets
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from websockets.asyncio.client import ClientConnection

from devtools.embedded_redis import free_port
from devtools.redis_cluster import EmbeddedRedisCluster
from relay.asgi import application
from relay.logging import event_fields
from relay.models import Channel, Environment, Membership, User
from relay.tokens import mint_token

BASE_DIR = Path(__file__).resolve().parent.parent
# The ceiling of every wait on a live instance; a pass normally takes a fraction of it.
WAIT = 15.0

# Presence timings for live instances, scaled from the production 30 s / 30 s / 10 s / 1 s.
# Generous against a loaded two-core machine: the margin is hundreds of local Redis round
# trips, the refresh a third of the TTL.
GRACE, TTL, REFRESH, MARGIN = 800, 900, 250, 200
CHECK = GRACE + MARGIN


def timings(grace: int = GRACE, ttl: int = TTL, refresh: int = REFRESH, margin: int = MARGIN, **extra: Any) -> dict:
    """Environment overrides for live instances: presence's timings, then any other variables."""
    return {
        "RELAY_PRESENCE_GRACE_MS": str(grace),
        "RELAY_PRESENCE_TTL_MS": str(ttl),
        "RELAY_PRESENCE_REFRESH_MS": str(refresh),
        "RELAY_PRESENCE_MARGIN_MS": str(margin),
        **{key: str(value) for key, value in extra.items()},
    }


# ── tenants ───────────────────────────────────────────────────────────────────
@dataclass
class Tenant:
    """An environment with its API key, users by id and channels by name."""

    environment: Environment
    api_key: str
    users: dict[str, User] = field(default_factory=dict)
    channels: dict[str, Channel] = field(default_factory=dict)

    def add_user(self, user_id: str, name: str = "") -> User:
        user = User.objects.create(environment=self.environment, external_id=user_id, name=name or user_id.title())
        self.users[user_id] = user
        return user

    def add_channel(self, name: str, kind: str = "public", members: tuple[str, ...] = ()) -> Channel:
        channel = Channel.objects.create(environment=self.environment, name=name, type=kind)
        for user_id in members:
            Membership.objects.create(channel=channel, user=self.users[user_id])
        self.channels[name] = channel
        return channel

    def token(self, user_id: str, ttl_seconds: int = 3600) -> str:
        return mint_token(self.environment, user_id, ttl_seconds)[0]


# database_sync_to_async rather than the async ORM: it closes its connection after each call,
# so PostgreSQL can drop the test database when the session ends.
@database_sync_to_async
def add_user(tenant: Tenant, user_id: str, channels: tuple[str, ...] = ()) -> User:
    """Create `user_id` in `tenant`, a member of `channels` (by name), from async code."""
    user = tenant.add_user(user_id)
    for name in channels:
        Membership.objects.create(channel=tenant.channels[name], user=user)
    return user


@database_sync_to_async
def set_large_room_members(tenant: Tenant, members: int) -> None:
    """Set the environment's `large_room_members` (above it a channel is counted, not named), from async code."""
    tenant.environment.large_room_members = members
    tenant.environment.save(update_fields=["large_room_members"])


@database_sync_to_async
def add_channel(tenant: Tenant, name: str, kind: str, members: tuple[str, ...]) -> Channel:
    """Create the channel `name` in `tenant` with `members`, from async code."""
    return tenant.add_channel(name, kind, members=members)


# ── live instances ────────────────────────────────────────────────────────────
def http(method: str, url: str, body: Any = None, api_key: str | None = None) -> tuple[int, Any]:
    """Make one HTTP call; return the status and the decoded JSON body (or None)."""
    status, decoded, _ = http_with_headers(method, url, body, api_key)
    return status, decoded


def http_with_headers(method: str, url: str, body: Any = None, api_key: str | None = None) -> tuple[int, Any, dict]:
    """Make one HTTP call; return the status, the decoded JSON body (or None) and the response headers."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            status, headers = response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        raw = error.read()
        status, headers = error.code, dict(error.headers)
    return status, (json.loads(raw) if raw else None), headers


def status_of(url: str, bearer: str | None = None) -> int:
    """GET `url` (with a bearer token, if given) and return only the status: any body, JSON or not."""
    request = urllib.request.Request(url)
    if bearer:
        request.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@dataclass
class Instance:
    """One real Daphne process serving relay.asgi:application."""

    name: str
    port: int
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen | None = None
    # `relay.serve` (Daphne tuned, as deployed by the README) or `daphne` itself, the contract's command.
    server: str = "relay.serve"
    # More of the server's own options (Daphne's), before the application.
    args: tuple[str, ...] = ()

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, token: str, cursor: dict | None = None) -> str:
        url = f"ws://127.0.0.1:{self.port}/v1/ws?token={quote(token)}"
        if cursor is not None:
            url += "&cursor=" + quote(json.dumps(cursor))
        return url

    def start(self, timeout: float = 30.0) -> "Instance":
        """Start Daphne and wait until /healthz answers."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.server,
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                *self.args,
                "relay.asgi:application",
            ],
            cwd=BASE_DIR,
            env=self.env,
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daphne {self.name} exited:\n{self.log_path.read_text()[-4000:]}")
            with contextlib.suppress(OSError):
                if http("GET", f"{self.http_url}/healthz")[0] == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"daphne {self.name} did not answer /healthz in {timeout}s")

    def stop(self) -> None:
        """Stop gracefully (SIGTERM): sockets are closed and timers cancelled."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """Die without closing anything (SIGKILL), as a crashed host would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def events(self, event: str | None = None) -> list[dict]:
        """The JSON log lines this instance wrote, optionally only one event's."""
        lines = []
        for raw in self.log_path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                line = json.loads(raw)
                if isinstance(line, dict) and (event is None or line.get("event") == event):
                    lines.append(line)
        return lines


def database_url(database: dict) -> str:
    """The DATABASE_URL of Django's `database` settings (the test database, once created)."""
    if database["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{database['NAME']}"
    credentials = quote(database["USER"] or "") + (f":{quote(database['PASSWORD'])}" if database["PASSWORD"] else "")
    return f"postgres://{credentials}@{database['HOST']}:{database['PORT']}/{database['NAME']}"


@contextlib.contextmanager
def write_lock_held(database: dict, table: str) -> Iterator[None]:
    """Hold the database's write lock on `table` from a connection of the test's own.

    SQLite has one write lock for the whole file; PostgreSQL takes it per table. Either way an
    instance's write to `table` waits until the block ends.
    """
    if database["ENGINE"] == "django.db.backends.sqlite3":
        lock = sqlite3.connect(database["NAME"], isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
    else:
        lock = psycopg.connect(database_url(database))
        lock.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
    try:
        yield
    finally:
        lock.rollback()
        lock.close()


def instance_env(database: str, redis_url: str, **overrides: str) -> dict[str, str]:
    """The environment of a live instance: the test database and Redis, scaled timings, JSON logs."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RELAY_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "relay.settings",
            "DATABASE_URL": database,
            "RELAY_REDIS_URL": redis_url,
            "RELAY_LOG_FORMAT": "json",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


def on_cluster(cluster: EmbeddedRedisCluster, **extra: str) -> dict[str, str]:
    """Instance settings with the layer and presence on `cluster`, emptied first."""
    cluster.flush()
    return {"RELAY_REDIS_CLUSTER_NODES": cluster.nodes_setting, **extra}


def new_instance(
    name: str, directory: Path, env: dict[str, str], server: str = "relay.serve", args: tuple[str, ...] = ()
) -> Instance:
    """An Instance on a free port, logging to `directory/name.log` (not started)."""
    return Instance(name=name, port=free_port(), env=env, log_path=directory / f"{name}.log", server=server, args=args)


# ── sockets that record every frame ───────────────────────────────────────────
class FrameRecorder(abc.ABC):
    """The frames a test socket received, in order, and ways to wait for them."""

    default_timeout = WAIT

    def __init__(self) -> None:
        self.frames: list[dict] = []
        self.close_code: int | None = None
        self._arrived = asyncio.Event()

    def _record(self, frame: dict) -> None:
        self.frames.append(frame)
        self._arrived.set()

    def _record_close(self, code: int | None) -> None:
        self.close_code = code
        self._arrived.set()

    @abc.abstractmethod
    async def send(self, frame_type: str, payload: Any) -> None:
        """Send one frame."""

    def of_type(self, frame_type: str) -> list[dict]:
        """The payloads of the frames of `frame_type` received so far."""
        return [frame["payload"] for frame in self.frames if frame["type"] == frame_type]

    async def wait_for(self, predicate: Callable[["FrameRecorder"], Any], timeout: float | None = None) -> Any:
        """Wait until `predicate(self)` is truthy and return its value."""
        timeout = timeout or self.default_timeout
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            result = predicate(self)
            if result:
                return result
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met in {timeout}s; frames so far: {self.frames[-20:]}")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def next_of(self, frame_type: str, after: int = 0, timeout: float | None = None) -> dict:
        """Wait for the first frame of `frame_type` at index >= `after`; return its payload."""

        def found(recorder: "FrameRecorder") -> dict | None:
            return next((f["payload"] for f in recorder.frames[after:] if f["type"] == frame_type), None)

        return await self.wait_for(found, timeout)

    async def closed(self, timeout: float | None = None) -> int:
        """Wait for the server to close the socket; return the close code."""
        await self.wait_for(lambda recorder: recorder.close_code is not None, timeout)
        return self.close_code

    def changes(self, user: str | None = None) -> list[dict]:
        """The `presence.changed` payloads received (about one user), in order."""
        return [change for change in self.of_type("presence.changed") if user is None or change["user"] == user]

    async def wait_changes(self, count: int, timeout: float | None = None) -> list[dict]:
        """Wait until `count` `presence.changed` frames arrived; return them all."""
        await self.wait_for(lambda recorder: len(recorder.changes()) >= count, timeout)
        return self.changes()

    def seqs(self, channel: Channel | None = None) -> list[int]:
        """The seqs of the `message.created` frames received (of one channel), in arrival order."""
        return [
            payload["seq"]
            for payload in self.of_type("message.created")
            if channel is None or payload["channel"] == str(channel.id)
        ]

    async def send_and_ack(self, payload: Any, timeout: float | None = None) -> dict:
        """Send a `message.send` and return the `message.ack` frame (or the `error` frame) answering it."""
        start = len(self.frames)
        await self.send("message.send", payload)
        return await self.wait_for(
            lambda recorder: next((f for f in recorder.frames[start:] if f["type"] in ("message.ack", "error")), None),
            timeout,
        )


async def open_communicator(token: str | None, query: str = "", app: Any = application) -> WebsocketCommunicator:
    """Open an in-process WebSocket on `app` (Relay's ASGI application) and assert it was accepted."""
    path = "/v1/ws" + ("" if token is None else f"?token={quote(token)}") + query
    communicator = WebsocketCommunicator(app, path)
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator


class Socket(FrameRecorder):
    """An in-process WebSocket on relay.asgi.application that records every frame, in order."""

    default_timeout = 10.0

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        super().__init__()
        self.communicator = communicator
        self._reader: asyncio.Task | None = None
        self._disconnected = False

    @classmethod
    async def open(
        cls, token: str, cursor: str | None = None, extra_query: str = "", app: Any = application
    ) -> "Socket":
        """Connect and return once the server answered: its `connection.ack`, or a close."""
        query = ("" if cursor is None else f"&cursor={quote(cursor)}") + extra_query
        socket = cls(await open_communicator(token, query, app))
        socket._reader = asyncio.create_task(socket._read())
        await socket.wait_for(lambda s: s.frames or s.close_code is not None)
        return socket

    async def _read(self) -> None:
        # A long timeout: the communicator cancels the application when a read times out.
        while True:
            output = await self.communicator.receive_output(timeout=3600)
            if output["type"] == "websocket.send":
                self._record(json.loads(output["text"]))
            elif output["type"] == "websocket.close":
                self._record_close(output.get("code", 1000))
                return

    async def send(self, frame_type: str, payload: Any) -> None:
        await self.communicator.send_json_to({"type": frame_type, "payload": payload})

    async def send_raw(self, text: str) -> None:
        await self.communicator.send_to(text_data=text)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.close_code is None and not self._disconnected:
            self._disconnected = True
            await self.communicator.disconnect(timeout=5)


class WsClient(FrameRecorder):
    """A real WebSocket client (the `websockets` library) on a live instance."""

    def __init__(self, connection: ClientConnection) -> None:
        super().__init__()
        self.connection = connection
        self._reader: asyncio.Task | None = None

    @classmethod
    async def open(cls, url: str) -> "WsClient":
        """Open the socket and return at once (see `connect` for one that waits until it is live)."""
        client = cls(await websockets.connect(url, open_timeout=10, max_size=2**21))
        client._reader = asyncio.create_task(client._read())
        return client

    async def _read(self) -> None:
        try:
            async for raw in self.connection:
                self._record(json.loads(raw))
        except websockets.ConnectionClosed:
            pass
        finally:
            self._record_close(self.connection.close_code)

    async def send(self, frame_type: str, payload: Any) -> None:
        await self.connection.send(json.dumps({"type": frame_type, "payload": payload}))

    async def send_raw(self, text: str) -> None:
        await self.connection.send(text)

    async def close(self) -> None:
        await self.connection.close()
        if self._reader:
            await self._reader


class Closable(Protocol):
    async def close(self) -> None: ...


Opened = TypeVar("Opened", bound=Closable)


class Closing:
    """The `closing` fixture: what a test opens through it is closed when the test ends.

    `linh = await closing(Socket.open(token))` (any awaitable giving something with an async,
    idempotent `close`); `closing.keep(client)` for one opened later. Closes a test makes as part
    of what it tests stay in the test; the teardown closes whatever is still open, newest first.
    """

    def __init__(self) -> None:
        self._opened: list[Closable] = []

    async def __call__(self, opening: Awaitable[Opened]) -> Opened:
        return self.keep(await opening)

    def keep(self, socket: Opened) -> Opened:
        self._opened.append(socket)
        return socket

    async def close_all(self) -> None:
        while self._opened:
            await self._opened.pop().close()


# ── raw in-process sockets (the consumer's own tests, read frame by frame) ────
async def next_frame(communicator: Any, timeout: float = 3.0, skip: str = "presence.") -> dict:
    """The next frame on an in-process socket whose type does not start with `skip`.

    Every connection gets presence frames (its snapshot, its own `online`); tests of
    other families read past them, and presence has its own tests.
    """
    while True:
        received = json.loads(await communicator.receive_from(timeout=timeout))
        if not received["type"].startswith(skip):
            return received


async def nothing_but(communicator: Any, timeout: float = 0.2, skip: str = "presence.") -> bool:
    """True when no frame other than `skip`'s arrives on an in-process socket within `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (remaining := deadline - asyncio.get_running_loop().time()) > 0:
        if await communicator.receive_nothing(timeout=remaining):
            return True
        received = json.loads(await communicator.receive_from(timeout=remaining))
        if not received["type"].startswith(skip):
            return False
    return True


# ── steps: connect, hear, prove silence, wait ────────────────────────────────
async def connect(instance: Instance, tenant: Tenant, user_id: str, cursor: dict | None = None) -> WsClient:
    """Open a live socket and wait for its snapshot: its groups are joined and its election is done."""
    client = await WsClient.open(instance.ws_url(tenant.token(user_id), cursor))
    await client.next_of("presence.snapshot", timeout=WAIT)
    return client


def states(client: FrameRecorder, user_id: str) -> list[str]:
    """The states `client` was told about `user_id`, in order."""
    return [change["state"] for change in client.changes(user_id)]


async def heard(client: FrameRecorder, user_id: str, count: int, timeout: float = WAIT) -> list[str]:
    """Wait until `client` heard `count` transitions of `user_id`; return them."""
    await client.wait_for(lambda c: len(states(c, user_id)) >= count, timeout)
    return states(client, user_id)


_probes = itertools.count()


async def barrier(
    instance: Instance | None, tenant: Tenant, watchers: list[FrameRecorder], channel: str = "general"
) -> FrameRecorder:
    """Connect a fresh probe sharing `channel`; return once every watcher heard its `online`.

    The probe connects to `instance`, or in this process when it is None. Its `online` was
    published after anything a test then rules out, and one watcher's socket delivers in publish
    order: an unwanted frame would already be there.
    """
    probe = f"probe-{next(_probes)}"
    await add_user(tenant, probe, (channel,))
    client = await (connect(instance, tenant, probe) if instance else Socket.open(tenant.token(probe)))
    for watcher in watchers:
        await heard(watcher, probe, 1)
    return client


def probe_id(client: FrameRecorder) -> str:
    """The user id a `barrier` probe connected as."""
    return client.of_type("connection.ack")[0]["user"]


async def close_all(*clients: Socket | WsClient) -> None:
    """Close every socket, in order."""
    for client in clients:
        await client.close()


async def until(condition: Callable[[], Any], timeout: float = WAIT, interval: float = 0.01) -> None:
    """Wait until `condition()` is truthy (state without a frame to wait on: a log file, Redis, a consumer)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s")
        await asyncio.sleep(interval)


async def logged(instance: Instance, event: str, timeout: float = WAIT, **fields: Any) -> list[dict]:
    """Wait until `instance` logged `event` with `fields`; return every such line."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in instance.events(event) if all(line.get(k) == v for k, v in fields.items())]
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{instance.name} never logged {event} {fields}; log: {instance.events()[-20:]}")
        await asyncio.sleep(0.05)


def lines(instances: list[Instance], event: str, **fields: Any) -> list[dict]:
    """Every line of `event` with `fields`, from all `instances`."""
    return [
        line
        for instance in instances
        for line in instance.events(event)
        if all(line.get(k) == v for k, v in fields.items())
    ]


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict]:
    """The fields of every `event` logged in this process (relay.logging's records), in order."""
    return [event_fields(record) for record in caplog.records if record.getMessage() == event]


def published(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """(user, state) of every presence transition this process published, in order."""
    return [(line["user"], line["state"]) for line in events(caplog, "presence.published")]


# ── clocks ────────────────────────────────────────────────────────────────────
class ManualTimer:
    """A ManualClock's pending call, cancellable as an event loop's timer is."""

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled


class ManualClock:
    """A clock (relay.clock.Clock) moved by hand: nothing it schedules runs until `advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, ManualTimer]] = []
        self._order = itertools.count()

    def call_later(self, seconds: float, callback: Callable[[], None]) -> ManualTimer:
        """Register `callback` to run when `advance` has moved time `seconds` past now."""
        timer = ManualTimer(self.now + seconds, callback)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        """Return once `advance` has moved time `seconds` past now."""
        woken = asyncio.get_running_loop().create_future()
        # done() when the sleeper was cancelled meanwhile (a service that stopped its refresh).
        self.call_later(seconds, lambda: woken.done() or woken.set_result(None))
        await woken

    def advance(self, seconds: float) -> None:
        """Move time on by `seconds`, running every timer that falls due, soonest first (ties in order made)."""
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self.now = when
            if not timer.cancelled():
                timer.callback()
        self.now = target


# The moment the agent registry's FrozenClock starts at.
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class FrozenClock:
    """The agent registry's clock (agents.actions.clock), frozen at `now` and moved by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        """Move `now` on by `timedelta(**delta)` and return it."""
        self.now += timedelta(**delta)
        return self.now
