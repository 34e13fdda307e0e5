"""Bound what a WebSocket connection has received and its application not yet taken; leave a socket unread on request.

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

The application can also ask for a connection not to be read for a while: a `websocket.send`
carrying `UNREAD_MS` (Relay's `rate_limited` error does) pauses reading the same way, until that
many milliseconds have passed and the queue is drained. Refusing a flood frame by frame costs
about what serving it would; left unread, the flooder's excess waits in its own TCP buffers, and
a connection over its rate costs its instance one socket read of frames per pause. ASGI
servers ignore a message's keys they do not know: without this module the key changes nothing.

Written against Daphne 4.1-4.2 (`daphne.ws_protocol.WebSocketProtocol.onMessage` and its
`application_queue`, `handle_reply`; requirements.txt pins the range) and Twisted's `ITCPTransport`
(`pauseProducing`/`resumeProducing`). Upstream: none open yet (Daphne's queue has no bound and
no option for one). Guard: tests/test_transport_guards.py, tests/test_fair_use_live.py.
"""

import sys
from collections import deque

MAX_QUEUED_BYTES = 1024 * 1024
MAX_QUEUED_FRAMES = 256
# While paused, how often the queue is looked at again (seconds).
CHECK_INTERVAL_S = 0.005
# Set on Daphne's protocol object; only this module reads it.
ATTRIBUTE = "relay_inbound"
# The key of a `websocket.send` that asks for its connection not to be read for that many ms.
UNREAD_MS = "relay.unread_ms"


class InboundMeter:
    """One connection's frames put into its application queue and not yet taken."""

    def __init__(self) -> None:
        self.sizes: deque[int] = deque()
        self.queued_bytes = 0
        self.paused = False
        # Reactor time before which the socket is not read, whatever the queue holds.
        self.unread_until = 0.0

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

    def readable(self, still_queued: int, now: float) -> bool:
        """True once the queue is drained and no wait the application asked for is left."""
        return self.drained(still_queued) and now >= self.unread_until


def install() -> None:
    """Bound every WebSocket's queued input, in a Daphne process; elsewhere nothing changes. Idempotent."""
    if "daphne.server" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketProtocol
    from twisted.internet import reactor

    on_message, reply = WebSocketProtocol.onMessage, WebSocketProtocol.handle_reply
    if getattr(on_message, "relay_inbound", False):
        return

    def meter_of(protocol: WebSocketProtocol) -> InboundMeter:
        meter: InboundMeter | None = getattr(protocol, ATTRIBUTE, None)
        if meter is None:
            meter = InboundMeter()
            setattr(protocol, ATTRIBUTE, meter)
        return meter

    def check_later(protocol: WebSocketProtocol, meter: InboundMeter) -> None:
        wait = max(CHECK_INTERVAL_S, meter.unread_until - reactor.seconds())
        reactor.callLater(wait, resume_when_readable, protocol, meter)

    def pause(protocol: WebSocketProtocol, meter: InboundMeter) -> None:
        if not meter.paused:
            meter.paused = True
            protocol.transport.pauseProducing()
            check_later(protocol, meter)

    def resume_when_readable(protocol: WebSocketProtocol, meter: InboundMeter) -> None:
        if not protocol.transport or getattr(protocol.transport, "disconnected", False):
            return
        if meter.readable(protocol.application_queue.qsize(), reactor.seconds()):
            meter.paused = False
            protocol.transport.resumeProducing()
        else:
            check_later(protocol, meter)

    def bounded_on_message(self: WebSocketProtocol, payload: bytes, is_binary: bool) -> None:
        on_message(self, payload, is_binary)
        queue = getattr(self, "application_queue", None)
        if queue is None or self.muted or self.transport is None:
            return
        meter = meter_of(self)
        if meter.put(len(payload), queue.qsize()):
            pause(self, meter)

    def unread_reply(self: WebSocketProtocol, message: dict) -> None:
        reply(self, message)
        unread_ms = message.get(UNREAD_MS)
        if unread_ms and self.transport is not None and getattr(self, "application_queue", None) is not None:
            meter = meter_of(self)
            meter.unread_until = max(meter.unread_until, reactor.seconds() + unread_ms / 1000)
            pause(self, meter)

    bounded_on_message.relay_inbound = True
    WebSocketProtocol.onMessage = bounded_on_message
    WebSocketProtocol.handle_reply = unread_reply
