"""Test support: live Daphne instances and a WebSocket client that records every frame.

Multi-instance behaviour is tested the way seed 004's integration suite does it:
several real Daphne processes on one real Redis and one database file, with
timings scaled down through the same environment variables an operator sets.
"""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import websockets
from websockets.asyncio.client import ClientConnection

from devtools.embedded_redis import free_port

BASE_DIR = Path(__file__).resolve().parent.parent


def http(method: str, url: str, body: Any = None, api_key: str | None = None) -> tuple[int, Any]:
    """Make one HTTP call; return the status and the decoded JSON body (or None)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw = error.read()
        status = error.code
    return status, (json.loads(raw) if raw else None)


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


def new_instance(
    name: str, directory: Path, env: dict[str, str], server: str = "relay.serve", args: tuple[str, ...] = ()
) -> Instance:
    """An Instance on a free port, logging to `directory/name.log` (not started)."""
    return Instance(name=name, port=free_port(), env=env, log_path=directory / f"{name}.log", server=server, args=args)


class FrameRecorder:
    """The frames a test socket received, in order, and ways to wait for them."""

    default_timeout = 5.0

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

    def of_type(self, frame_type: str) -> list[dict]:
        return [frame["payload"] for frame in self.frames if frame["type"] == frame_type]

    async def wait_for(self, predicate: Any, timeout: float | None = None) -> Any:
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


class WsClient(FrameRecorder):
    """A real WebSocket client (the `websockets` library) on a live instance."""

    def __init__(self, connection: ClientConnection) -> None:
        super().__init__()
        self.connection = connection
        self._reader: asyncio.Task | None = None

    @classmethod
    async def open(cls, url: str) -> "WsClient":
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

    async def closed(self, timeout: float = 5.0) -> int:
        """Wait for the server to close the socket; return the close code."""
        await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        return self.close_code

    async def close(self) -> None:
        await self.connection.close()
        if self._reader:
            await self._reader


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
