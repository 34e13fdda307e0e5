"""The frame size rule: Daphne's 1 MiB per message and per frame, counted in bytes.

Daphne (autobahn) refuses a frame whose header announces more than 1 MiB of payload, with 1009,
before reading the payload into memory; the consumer has no size check of its own. So the rule
is about UTF-8 bytes, not characters: a frame of 4-byte characters just under 1 MiB is answered,
and one just over is closed although it has a quarter as many characters.
"""

import contextlib
import json
from pathlib import Path

import pytest
import websockets

from tests.support import WAIT, Instance, WsClient, connect

pytestmark = pytest.mark.live

MIB = 1024 * 1024
EMOJI = "\U0001f600"  # four bytes in UTF-8


def memory_kb(instance: Instance, field: str) -> int:
    """`VmRSS` or `VmHWM` (the peak) of the instance's process, in kB."""
    for line in Path(f"/proc/{instance.process.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def padded_frame(size_bytes: int) -> str:
    """A `message.send` frame of exactly `size_bytes` UTF-8 bytes, padded with 4-byte characters.

    The padding is an unknown field, so a frame that gets through is answered `invalid_frame`.
    """
    channel = "00000000-0000-4000-8000-000000000000"
    payload = {"idem_key": "k", "channel": channel, "text": "hi", "padding": ""}
    head = json.dumps({"type": "message.send", "payload": payload})[:-3]
    fill = size_bytes - len(head.encode()) - len('"}}')
    frame = head + EMOJI * (fill // 4) + "x" * (fill % 4) + '"}}'
    assert len(frame.encode()) == size_bytes
    return frame


async def test_a_frame_just_under_1_mib_of_multibyte_characters_is_answered(live_instances, acme, closing):
    (instance,) = live_instances(1)
    linh = await closing(connect(instance, acme, "linh"))
    frame = padded_frame(MIB - 16)
    assert len(frame) < MIB // 3  # characters: far under the limit either way
    await linh.send_raw(frame)
    error = await linh.next_of("error", timeout=WAIT)
    assert error["code"] == "invalid_frame"
    assert "padding" in error["message"]
    assert linh.close_code is None


async def test_a_frame_just_over_1_mib_in_bytes_is_closed_1009_though_its_characters_are_fewer(
    live_instances, acme, closing
):
    (instance,) = live_instances(1)
    linh = await closing(connect(instance, acme, "linh"))
    frame = padded_frame(MIB + 1)
    assert len(frame) < MIB // 3
    await linh.send_raw(frame)
    assert await linh.closed(timeout=WAIT) == 1009
    # The limit is the socket's, not the instance's: the next connection is served.
    again = await closing(connect(instance, acme, "linh"))
    assert again.of_type("connection.ack")


async def test_an_8_mib_frame_is_closed_1009_without_being_buffered(live_instances, acme, closing):
    (instance,) = live_instances(1)
    linh = await closing(connect(instance, acme, "linh"))
    before = memory_kb(instance, "VmRSS")
    # Refused, perhaps before the client finished writing it.
    with contextlib.suppress(websockets.ConnectionClosed):
        await linh.connection.send("x" * (8 * MIB))
    assert await linh.closed(timeout=WAIT) == 1009
    # Its peak memory never held the frame: autobahn refused it on the frame's header.
    assert memory_kb(instance, "VmHWM") - before < 4 * 1024
    again = await closing(WsClient.open(instance.ws_url(acme.token("linh"))))
    assert (await again.next_of("connection.ack", timeout=WAIT))["user"] == "linh"
