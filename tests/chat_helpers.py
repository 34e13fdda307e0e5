"""What the chat tests share: malformed `message.send` payloads, a well-formed one, and history stored fast."""

import json
import uuid
from typing import Any

from django.db.models import F

from chat.models import Message
from relay.models import Channel, User

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
