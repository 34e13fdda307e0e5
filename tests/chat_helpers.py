"""Helpers the message tests share: storing history fast, and an in-process socket that records frames."""

import asyncio
import contextlib
import json
import uuid
from typing import Any
from urllib.parse import quote

from channels.testing import WebsocketCommunicator
from django.db.models import F

from chat.models import Message
from relay.asgi import application
from relay.models import Channel, User
from tests.support import FrameRecorder

# Every way a `message.send` payload can be malformed; each must be refused with nothing stored.
# `{channel}` is replaced by a channel the sender belongs to, so only the named flaw is wrong.
MALFORMED_SENDS: dict[str, dict] = {
    "unknown field": {"idem_key": "k", "channel": "{channel}", "text": "hi", "extra": 1},
    "missing idem_key": {"channel": "{channel}", "text": "hi"},
    "missing channel": {"idem_key": "k", "text": "hi"},
    "missing text": {"idem_key": "k", "channel": "{channel}"},
    "text is a number": {"idem_key": "k", "channel": "{channel}", "text": 5},
    "text is null": {"idem_key": "k", "channel": "{channel}", "text": None},
    "text is a list": {"idem_key": "k", "channel": "{channel}", "text": ["hi"]},
    "idem_key is a number": {"idem_key": 7, "channel": "{channel}", "text": "hi"},
    "channel is a number": {"idem_key": "k", "channel": 1, "text": "hi"},
    "empty text": {"idem_key": "k", "channel": "{channel}", "text": ""},
    "text over 16384 characters": {"idem_key": "k", "channel": "{channel}", "text": "x" * 16_385},
    "text with NUL": {"idem_key": "k", "channel": "{channel}", "text": "a\x00b"},
    "empty idem_key": {"idem_key": "", "channel": "{channel}", "text": "hi"},
    "idem_key over 128 characters": {"idem_key": "k" * 129, "channel": "{channel}", "text": "hi"},
    "idem_key with a newline": {"idem_key": "k\n1", "channel": "{channel}", "text": "hi"},
    "idem_key with DEL": {"idem_key": "k\x7f", "channel": "{channel}", "text": "hi"},
    "idem_key with a C1 control": {"idem_key": "k\x85", "channel": "{channel}", "text": "hi"},
    "channel not a UUID": {"idem_key": "k", "channel": "fleet", "text": "hi"},
    "channel an empty string": {"idem_key": "k", "channel": "", "text": "hi"},
    "payload is a list": ["k", "{channel}", "hi"],
    "payload is a string": "hi",
}


def malformed(name: str, channel_id: str) -> Any:
    """The malformed payload `name`, aimed at `channel_id`."""
    return json.loads(json.dumps(MALFORMED_SENDS[name]).replace("{channel}", channel_id))


def store_history(channel: Channel, author: User, count: int) -> None:
    """Store `count` messages after the channel's last one, the way send_message numbers them."""
    channel.refresh_from_db()
    first = channel.last_seq + 1
    Message.objects.bulk_create(
        Message(channel=channel, author=author, seq=seq, idem_key=f"history-{seq}", text=f"message {seq}")
        for seq in range(first, first + count)
    )
    Channel.objects.filter(pk=channel.pk).update(last_seq=F("last_seq") + count)


def send_payload(channel: Channel | str, text: str = "hello", idem_key: str | None = None) -> dict:
    """A well-formed `message.send` payload."""
    return {"idem_key": idem_key or uuid.uuid4().hex, "channel": str(getattr(channel, "id", channel)), "text": text}


class Socket(FrameRecorder):
    """An in-process WebSocket on relay.asgi.application that records every frame, in order."""

    default_timeout = 10.0

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        super().__init__()
        self.communicator = communicator
        self._reader: asyncio.Task | None = None

    @classmethod
    async def open(cls, token: str, cursor: str | None = None, extra_query: str = "") -> "Socket":
        path = f"/v1/ws?token={quote(token)}" + ("" if cursor is None else f"&cursor={quote(cursor)}") + extra_query
        communicator = WebsocketCommunicator(application, path)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        socket = cls(communicator)
        socket._reader = asyncio.create_task(socket._read())
        await socket.next_of("connection.ack")
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

    def seqs(self, channel: Channel | None = None) -> list[int]:
        """The seqs of the `message.created` frames received (of one channel), in arrival order."""
        return [
            payload["seq"]
            for payload in self.of_type("message.created")
            if channel is None or payload["channel"] == str(channel.id)
        ]

    async def send_and_ack(self, payload: dict) -> dict:
        """Send a `message.send` and return its `message.ack` (or the `error` it got)."""
        start = len(self.frames)
        await self.send("message.send", payload)
        return await self.wait_for(
            lambda s: next((f for f in s.frames[start:] if f["type"] in ("message.ack", "error")), None)
        )

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.close_code is None:
            await self.communicator.disconnect(timeout=5)
