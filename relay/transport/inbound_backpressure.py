"""Bound what a WebSocket connection has received and its application not yet taken.

Daphne puts every frame autobahn reads into the connection's application queue (an unbounded
`asyncio.Queue`) and keeps reading the socket: a client that sends faster than its consumer
handles frames (each `message.send` waits for the database) grows the instance's memory without
bound, and every frame it queued is work the instance still owes it. `install` wraps Daphne's
`WebSocketProtocol.onMessage`: once a connection's queue holds more than `MAX_QUEUED_BYTES` or
`MAX_QUEUED_FRAMES`, the protocol stops reading its socket (Twisted's `pauseProducing` on the
transport), and starts again once the consumer has taken the queue below half of both. The
client's sends then wait in TCP's windows, on the client's side, as they would against any slow
server; the instance holds at most about 1 MiB and a socket read of each connection's input.

What the queue still holds is known without touching Daphne's queue: frames leave it in the
order they came, so the sizes of the last `qsize()` frames put are the ones still queued.

Written against Daphne 4.1-4.2 (`daphne.ws_protocol.WebSocketProtocol.onMessage` and its
`application_queue`, requirements.txt pins the range) and Twisted's `ITCPTransport`
(`pauseProducing`/`resumeProducing`). Upstream: none open yet (Daphne's queue has no bound and
no option for one). Guard: tests/test_transport_guards.py, tests/test_fair_use_live.py.
"""

import sys
from collections import deque
from typing import Any

MAX_QUEUED_BYTES = 1024 * 1024
MAX_QUEUED_FRAMES = 256
# While paused, how often the queue is looked at again (seconds).
CHECK_INTERVAL_S = 0.005
# Set on Daphne's protocol object; only this module reads it.
ATTRIBUTE = "relay_inbound"


class InboundMeter:
    """One connection's frames put into its application queue and not yet taken."""

    def __init__(self) -> None:
        self.sizes: deque[int] = deque()
        self.queued_bytes = 0
        self.paused = False

    def put(self, size: int, still_queued: int) -> bool:
        """Count a frame just queued (`still_queued` frames in the queue now); True when reading should pause."""
        self.sizes.append(size)
        self.queued_bytes += size
        self.taken(still_queued)
        return self.queued_bytes > MAX_QUEUED_BYTES or len(self.sizes) > MAX_QUEUED_FRAMES

    def taken(self, still_queued: int) -> None:
        """Forget the frames the application has taken since (the oldest ones)."""
        while len(self.sizes) > still_queued:
            self.queued_bytes -= self.sizes.popleft()

    def drained(self, still_queued: int) -> bool:
        """True once the queue is below half of both bounds."""
        self.taken(still_queued)
        return self.queued_bytes <= MAX_QUEUED_BYTES // 2 and len(self.sizes) <= MAX_QUEUED_FRAMES // 2


def install() -> None:
    """Bound every WebSocket's queued input, in a Daphne process; elsewhere nothing changes. Idempotent."""
    if "daphne.server" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketProtocol
    from twisted.internet import reactor

    on_message = WebSocketProtocol.onMessage
    if getattr(on_message, "relay_inbound", False):
        return

    def resume_when_drained(protocol: Any, meter: InboundMeter) -> None:
        if not protocol.transport or getattr(protocol.transport, "disconnected", False):
            return
        if meter.drained(protocol.application_queue.qsize()):
            meter.paused = False
            protocol.transport.resumeProducing()
        else:
            reactor.callLater(CHECK_INTERVAL_S, resume_when_drained, protocol, meter)

    def bounded_on_message(self: WebSocketProtocol, payload: bytes, is_binary: bool) -> None:
        on_message(self, payload, is_binary)
        queue = getattr(self, "application_queue", None)
        if queue is None or self.muted or self.transport is None:
            return
        meter: InboundMeter | None = getattr(self, ATTRIBUTE, None)
        if meter is None:
            meter = InboundMeter()
            setattr(self, ATTRIBUTE, meter)
        if meter.put(len(payload), queue.qsize()) and not meter.paused:
            meter.paused = True
            self.transport.pauseProducing()
            reactor.callLater(CHECK_INTERVAL_S, resume_when_drained, self, meter)

    bounded_on_message.relay_inbound = True
    WebSocketProtocol.onMessage = bounded_on_message
