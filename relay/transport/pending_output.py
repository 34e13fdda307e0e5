"""Bound the output a WebSocket connection has queued and not yet written to its socket.

Daphne hands each frame the application sends straight to autobahn, which writes it to the
Twisted transport at once: nothing waits for the client. A client that stops reading (its TCP
window closed) leaves every frame sent to it in the transport's buffer, without bound: 40 MB sent
to one stalled member cost its instance 36 MB of memory, and a few such clients take an instance
down for everyone. Daphne has no limit for it (upstream: django/daphne#170, open since 2018).

Twisted says when a transport's buffer is full through its public producer interface: a
registered streaming producer (`IPushProducer`) is paused when the buffer passes the transport's
`bufferSize` (64 KiB) and resumed once the buffer has been written out entirely. `PendingOutput` is
that producer for one connection: while it is paused, a frame that would take the transport's
buffer past the limit is refused with `OutputBacklogFull`, as is every frame after it. The
application decides what a refusal means (Relay closes with 4008); the connection's memory stays
bounded whether or not the client ever reads again.

"Pending" is what the buffer holds now, read the way Twisted itself reads it to decide when to
pause (`FileDescriptor.dataBuffer`, `offset`, `_tempDataLen`): a client that keeps up, its buffer
never quite empty under a steady stream, is not refused for what it already read. A transport
without that buffer (one Twisted wraps, for TLS) falls back to counting every frame handed to it
since the buffer last filled, which over-counts for such a client: that case errs on the side of
the instance's memory.

The transport arrives from Daphne's HTTP upgrade with Twisted's HTTP channel still registered as
its producer (which does nothing for a WebSocket); it is replaced at `websocket.accept`.

Written for Daphne 4.1-4.2 (`WebSocketProtocol.handle_reply`, requirements.txt pins the range) on
Twisted's producer interface; tests/test_slow_readers.py guards both.
"""

import sys
from typing import Any

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from relay.exceptions import OutputBacklogFull

# Set on Daphne's protocol object; only this module reads it.
METER_ATTRIBUTE = "relay_pending_output"


@implementer(IPushProducer)
class PendingOutput:
    """One connection's output counted since its transport's buffer last filled (an IPushProducer)."""

    def __init__(self, limit: int, transport: object = None) -> None:
        self.limit = limit
        self.transport = transport
        self.paused = False
        # Counted only for a transport whose buffer cannot be read (see the module's docstring).
        self.pending = 0
        self.refusing = False

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        # The buffer was written out entirely.
        self.paused = False
        self.pending = 0

    def stopProducing(self) -> None:
        """The connection is gone; Twisted drops the producer with it."""

    def admit(self, message: dict) -> None:
        """Count a `websocket.send` about to be written, or raise OutputBacklogFull.

        Frames are measured only while the buffer is full: a connection that keeps up pays nothing.
        """
        if not (self.paused or self.refusing):
            return
        size = _frame_size(message)
        buffered = _buffered(self.transport)
        pending = self.pending if buffered is None else buffered
        if self.refusing or pending + size > self.limit:
            self.refusing = True
            raise OutputBacklogFull(pending)
        if buffered is None:
            self.pending += size


def _buffered(transport: object) -> int | None:
    """The bytes `transport` holds unwritten, as Twisted's FileDescriptor counts them; None when it cannot tell."""
    try:
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    except (AttributeError, TypeError):
        return None


def _frame_size(message: dict) -> int:
    if (text := message.get("text")) is not None:
        return len(text.encode())
    return len(message.get("bytes") or b"")


def install(limit: int) -> None:
    """Bound every WebSocket's pending output to `limit` bytes, in a Daphne process.

    Elsewhere (tests in-process, management commands) nothing is imported or changed, as in
    `relay.transport.websocket_options`. Safe to call more than once.
    """
    if "daphne.server" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketProtocol

    reply = WebSocketProtocol.handle_reply
    if getattr(reply, "relay_pending_output", False):
        return

    def bounded_reply(self: WebSocketProtocol, message: dict) -> Any:
        meter: PendingOutput | None = getattr(self, METER_ATTRIBUTE, None)
        if meter is not None and message.get("type") == "websocket.send":
            meter.admit(message)
        result = reply(self, message)
        if meter is None and message.get("type") == "websocket.accept" and self.transport is not None:
            meter = PendingOutput(limit, self.transport)
            self.transport.unregisterProducer()
            self.transport.registerProducer(meter, True)
            setattr(self, METER_ATTRIBUTE, meter)
        return result

    bounded_reply.relay_pending_output = True
    WebSocketProtocol.handle_reply = bounded_reply
