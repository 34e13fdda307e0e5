"""A client that stops reading is cut loose with 4008; every other connection keeps every frame.

The stalled client is a raw TCP socket with a small receive buffer that does the WebSocket
handshake and then never reads again, as a client whose TCP window closed. The healthy one is a
normal client in the same channel. Messages are fed into the channel through the channel layer,
as an instance's fan-out carries them, each only once the healthy client has read the one
`WINDOW` before it: a client that keeps up never has more than that in flight.

The limit here is small (RELAY_MAX_PENDING_BYTES, 256 KiB) so that the kernel's own socket
buffers (up to 4 MiB on loopback) and the limit fill after a few megabytes.
"""

import contextlib
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from channels.layers import get_channel_layer
from django.utils import timezone
from twisted.internet.abstract import FileDescriptor
from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

from chat.handlers import chat_group
from relay.exceptions import OutputBacklogFull
from relay.transport.pending_output import PendingOutput
from tests.support import WAIT, Instance, connect, heard, logged, timings

LIMIT = 256 * 1024
# 16,384 four-byte characters: the largest `text` a message may have, ≈ 64 KiB a frame.
TEXT = "\U0001f600" * 16_384
WINDOW = 2
MESSAGES = 300  # ≈ 19 MiB to each member
GRACE, MARGIN = 300, 100
# autobahn waits this long for a peer to answer the close (relay/transport/websocket_options.py): the stalled
# client never does, so its connection ends, and its user's grace begins, only then.
CLOSE_HANDSHAKE_S = 10.0


@contextlib.contextmanager
def stalled_client(instance: Instance, token: str) -> Iterator[socket.socket]:
    """A WebSocket on `instance` that completes its handshake and then never reads again."""
    client = ClientProtocol(parse_uri(instance.ws_url(token)))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Before connecting, so the window the kernel advertises stays small.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT)
    sock.connect(("127.0.0.1", instance.port))
    try:
        client.send_request(client.connect())
        sock.sendall(b"".join(client.data_to_send()))
        while client.state is State.CONNECTING:
            data = sock.recv(1024)
            assert data, "the server closed before the handshake completed"
            client.receive_data(data)
        assert client.state is State.OPEN
        yield sock
    finally:
        sock.close()


def memory_kb(instance: Instance, field: str) -> int:
    for line in Path(f"/proc/{instance.process.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def created(channel_id: str, seq: int) -> dict:
    """A `message.created` event as `message.send` publishes it."""
    message = {
        "id": str(uuid.uuid4()),
        "channel": channel_id,
        "seq": seq,
        "user": "tuan",
        "text": TEXT,
        "created_at": timezone.now().isoformat(),
    }
    return {"type": "message.created", "message": message}


@pytest.mark.live
async def test_a_stalled_reader_is_closed_4008_while_its_co_member_receives_every_message(
    live_instances, acme, closing
):
    (instance,) = live_instances(1, **timings(grace=GRACE, margin=MARGIN, RELAY_MAX_PENDING_BYTES=LIMIT))
    fleet = str(acme.channels["fleet"].id)
    tuan = await closing(connect(instance, acme, "tuan"))
    layer = get_channel_layer()
    with stalled_client(instance, acme.token("linh")):
        assert await heard(tuan, "linh", 1) == ["online"]
        before = memory_kb(instance, "VmRSS")
        for seq in range(1, MESSAGES + 1):
            if seq > WINDOW:
                await tuan.wait_for(lambda c, want=seq - WINDOW: len(c.of_type("message.created")) >= want, WAIT)
            await layer.group_send(chat_group(fleet), created(fleet, seq))
        await tuan.wait_for(lambda c: len(c.of_type("message.created")) >= MESSAGES, WAIT)
        grown_kb = memory_kb(instance, "VmHWM") - before

        # The healthy member got every message, in order, and is still connected.
        assert [m["seq"] for m in tuan.of_type("message.created")] == list(range(1, MESSAGES + 1))
        assert tuan.close_code is None
        # The stalled one was cut loose once, at the limit, and logged by id and user only.
        (slow,) = await logged(instance, "connection.slow", user="linh")
        assert set(slow) == {"time", "level", "event", "connection_id", "user", "pending_bytes"}
        assert slow["level"] == "warning"
        assert LIMIT - len(TEXT.encode()) - 1024 < slow["pending_bytes"] <= LIMIT
        # ≈ 19 MiB were sent to it: the instance held none of it past the limit (and the kernel's
        # buffers, which are not the process's memory).
        assert grown_kb < (LIMIT + 8 * 1024 * 1024) // 1024

        # It never reads the close, so its connection ends after the close handshake's wait; its
        # user then goes offline after the grace, like anyone who leaves.
        offline_within = CLOSE_HANDSHAKE_S + (GRACE + MARGIN) / 1000 + WAIT
        assert await heard(tuan, "linh", 2, timeout=offline_within) == ["online", "offline"]
    await logged(instance, "connection.closed", user="linh")


# ── guards on what relay/transport/pending_output.py relies on ───────────────
class _Buffered(FileDescriptor):
    """Twisted's buffered transport, writing to a list instead of a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.connected = 1
        self.written: list[bytes] = []

    def writeSomeData(self, data: bytes) -> int:
        self.written.append(bytes(data))
        return len(data)

    def startWriting(self) -> None:
        pass

    def stopWriting(self) -> None:
        pass


def test_twisted_pauses_a_registered_producer_when_its_buffer_fills_and_resumes_it_drained():
    transport = _Buffered()
    meter = PendingOutput(limit=LIMIT)
    transport.registerProducer(meter, True)
    transport.write(b"x" * 1000)
    assert not meter.paused
    transport.write(b"x" * transport.bufferSize)
    assert meter.paused
    meter.admit({"type": "websocket.send", "text": "\U0001f600" * 10})
    assert meter.pending == 40  # bytes, not characters
    transport.doWrite()
    assert b"".join(transport.written) == b"x" * (1000 + transport.bufferSize)
    assert not meter.paused
    assert meter.pending == 0


def test_a_paused_meter_refuses_the_frame_that_would_pass_its_limit_and_every_one_after():
    meter = PendingOutput(limit=100)
    meter.admit({"type": "websocket.send", "text": "x" * 1000})  # not paused: not counted
    meter.pauseProducing()
    meter.admit({"type": "websocket.send", "text": "x" * 60})
    with pytest.raises(OutputBacklogFull) as refused:
        meter.admit({"type": "websocket.send", "text": "x" * 60})
    assert refused.value.pending_bytes == 60
    meter.resumeProducing()
    # Drained or not, a connection refused once stays refused: it is being closed.
    with pytest.raises(OutputBacklogFull):
        meter.admit({"type": "websocket.send", "bytes": b"x"})


class _Trickling(_Buffered):
    """A client that reads, on each chance, about as much as the server sends it: never all."""

    def __init__(self, per_write: int) -> None:
        super().__init__()
        self.per_write = per_write

    def writeSomeData(self, data: bytes) -> int:
        return super().writeSomeData(bytes(data[: self.per_write]))


def test_a_reader_that_keeps_up_without_ever_draining_is_measured_by_what_its_buffer_holds():
    frame = "x" * 10_000
    transport = _Trickling(per_write=len(frame))
    meter = PendingOutput(limit=100_000, transport=transport)
    transport.registerProducer(meter, True)
    transport.write(b"x" * (transport.bufferSize + 1))
    assert meter.paused
    for _ in range(100):  # 1 MB, ten times the limit, while the buffer holds about 75 KB
        meter.admit({"type": "websocket.send", "text": frame})
        transport.write(frame.encode())
        transport.doWrite()
    assert meter.paused  # never drained, so never resumed
    assert sum(map(len, transport.written)) == 100 * len(frame)
    # Once it stops reading, the buffer reaches the limit and the meter refuses.
    with pytest.raises(OutputBacklogFull) as refused:
        for _ in range(10):
            meter.admit({"type": "websocket.send", "text": frame})
            transport.write(frame.encode())
    assert 100_000 - len(frame) < refused.value.pending_bytes <= 100_000


async def test_daphne_sends_every_application_message_through_the_protocol_method_patched():
    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol

    class Recording(WebSocketProtocol):
        """A protocol whose method the patch wraps, recording what Daphne's server hands it."""

        def __init__(self) -> None:
            self.replies: list[dict] = []

        def handle_reply(self, message: dict) -> None:
            self.replies.append(message)

    protocol = Recording()
    server = Server(application=None, endpoints=["tcp:0"])
    server.connections = {protocol: {"connected": 0}}
    frame = {"type": "websocket.send", "text": "hello"}
    await server.handle_reply(protocol, frame)
    assert protocol.replies == [frame]
