"""A scripted stand-in for a Relay instance, for what a real one never does.

A real Relay never sends an unknown frame type or a malformed frame, never closes with a code
on cue, and never drops a connection between receiving a `message.send` and answering it. The
client must survive all of these, so these tests script them: each connection runs the test's
`script(connection)`; the history endpoint answers from `history`. Everything else about the
client is tested against real instances (tests/test_python_client.py).
"""

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

HISTORY_PATH = re.compile(r"^/v1/channels/(?P<channel>[^/]+)/messages$")


@dataclass
class Connection:
    """One connection to the scripted server: its query, the frames it sent, ways to answer."""

    socket: ServerConnection
    query: dict[str, str]
    received: list[dict] = field(default_factory=list)

    @property
    def cursor(self) -> dict[str, int] | None:
        return json.loads(self.query["cursor"]) if "cursor" in self.query else None

    async def send(self, frame_type: str, payload: Any) -> None:
        await self.socket.send(json.dumps({"type": frame_type, "payload": payload}))

    async def send_raw(self, data: str | bytes) -> None:
        await self.socket.send(data)

    async def hello(self, user: str, channels: list[str], online: list[str]) -> None:
        """What a real Relay sends first: the ack, then the snapshot."""
        await self.send("connection.ack", {"connection_id": f"c{id(self)}", "user": user, "channels": channels})
        await self.send("presence.snapshot", {"online": online})

    async def next_frame(self, timeout: float = 10.0) -> dict:
        frame = json.loads(await asyncio.wait_for(self.socket.recv(), timeout))
        self.received.append(frame)
        return frame

    async def drain(self) -> None:
        """Read (and record) frames until the client closes."""
        try:
            while True:
                await self.next_frame(timeout=3600)
        except ConnectionClosed:
            pass


Script = Callable[[Connection], Awaitable[None]]


@dataclass
class ScriptedRelay:
    """The server: `url` for the client, `connections` in the order they came."""

    script: Script
    history: dict[str, list[dict]] = field(default_factory=dict)
    history_status: int = 200
    # Where the history endpoint redirects to (302), instead of answering.
    history_redirect: str | None = None
    # Bytes of padding the history endpoint adds to each page (an extra field the client ignores).
    history_padding: int = 0
    connections: list[Connection] = field(default_factory=list)
    history_requests: list[str] = field(default_factory=list)
    history_headers: list[dict[str, str]] = field(default_factory=list)
    server: Server | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    scripts: set[asyncio.Task] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def __aenter__(self) -> "ScriptedRelay":
        self.server = await serve(self._serve, "127.0.0.1", 0, process_request=self._http)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # A script still waiting (its test failed before releasing it) must not hold the server open.
        for script in self.scripts:
            script.cancel()
        self.server.close()
        await self.server.wait_closed()

    async def connection(self, index: int, timeout: float = 15.0) -> Connection:
        """Wait for the `index`-th connection (0-based)."""
        async with asyncio.timeout(timeout):
            while len(self.connections) <= index:
                self.arrived.clear()
                await self.arrived.wait()
        return self.connections[index]

    async def _serve(self, socket: ServerConnection) -> None:
        query = {key: values[0] for key, values in parse_qs(urlsplit(socket.request.path).query).items()}
        connection = Connection(socket, query)
        self.connections.append(connection)
        self.arrived.set()
        self.scripts.add(asyncio.current_task())
        await self.script(connection)

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        parts = urlsplit(request.path)
        found = HISTORY_PATH.match(parts.path)
        if found is None:
            return None  # the WebSocket handshake goes on
        self.history_requests.append(request.path)
        self.history_headers.append(dict(request.headers.raw_items()))
        if self.history_redirect is not None:
            response = connection.respond(302, "")
            response.headers["Location"] = self.history_redirect + request.path
            return response
        if self.history_status != 200:
            return connection.respond(self.history_status, "{}")
        query = {key: int(values[0]) for key, values in parse_qs(parts.query).items()}
        after, limit = query.get("after", 0), query.get("limit", 100)
        messages = [m for m in self.history.get(found["channel"], []) if m["seq"] > after][:limit]
        next_after = messages[-1]["seq"] if len(messages) == limit else None
        body = {"channel": found["channel"], "messages": messages, "next_after": next_after}
        if self.history_padding:
            body["padding"] = "x" * self.history_padding
        return connection.respond(200, json.dumps(body))


def message(channel: str, seq: int, text: str | None = None, user: str = "tuan") -> dict:
    """A `message.created` payload."""
    return {
        "id": f"m-{seq}",
        "channel": channel,
        "seq": seq,
        "user": user,
        "text": text or f"message {seq}",
        "created_at": "2026-12-04T00:00:00+00:00",
    }
