"""A real local HTTP receiver for webhooks, and the waits the live webhook tests share."""

import json
import ssl
import threading
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from devtools.embedded_redis import free_port
from tests.support import Instance, until

# What the receiver answers: a status, "hang" (never answers while hanging), or nothing at all
# when it is stopped (connections refused).
Mode = int | str


@dataclass
class Received:
    """One request the receiver read (answered or not)."""

    headers: dict[str, str]
    body: bytes
    answered: int | None = None

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def event(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """An http.server on 127.0.0.1 that records every request and answers as `mode` says."""

    mode: Mode = 200
    port: int = field(default_factory=free_port)
    requests: list[Received] = field(default_factory=list)
    hanging: int = 0
    # Serve HTTPS with this context (its certificate) instead of HTTP.
    tls: ssl.SSLContext | None = None
    _server: ThreadingHTTPServer | None = None
    _release: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                seen = Received({k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length))
                receiver.requests.append(seen)
                mode = receiver.mode
                if mode == "hang":
                    receiver.hanging += 1
                    receiver._release.wait(60)
                    receiver.hanging -= 1
                    return
                seen.answered = int(mode)
                self.send_response(int(mode))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._release.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening: connections are refused until `start` again."""
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def delivered(self, kind: str | None = None) -> list[Received]:
        """The requests answered 2xx (of one event type), in arrival order."""
        return [
            r
            for r in self.requests
            if r.answered is not None and 200 <= r.answered < 300 and (kind is None or r.event["type"] == kind)
        ]

    def of(self, kind: str, **data: str) -> list[Received]:
        """The delivered events of `kind` whose data has `data`."""
        return [r for r in self.delivered(kind) if all(r.event["data"].get(k) == v for k, v in data.items())]

    async def wait(self, kind: str, count: int = 1, **data: str) -> list[Received]:
        """Wait until `count` events of `kind` (with `data`) were delivered; return them."""
        await until(lambda: len(self.of(kind, **data)) >= count)
        return self.of(kind, **data)


def knows_endpoints(instance: Instance, count: int = 1) -> bool:
    """Whether the instance's worker has read that `count` environments listen (its /metrics)."""
    with urllib.request.urlopen(f"{instance.http_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return any(line == f"relay_webhook_environments {float(count)}" for line in text.splitlines())


async def listening(instances: list[Instance], count: int = 1) -> None:
    """Wait until every instance writes presence events for `count` listening environments."""
    for instance in instances:
        await until(lambda instance=instance: knows_endpoints(instance, count))
