"""The events (docs/contract.md, Webhooks): their names, their envelope and the in-process signal.

Every event is delivered as `{"type", "timestamp", "data"}`, signed under a `webhook-id` that
is minted once per event, so every endpoint and every retry carry the same one.
"""

import uuid
from datetime import UTC, datetime

import orjson
from django.dispatch import Signal

USER_ONLINE = "user.online"
USER_OFFLINE = "user.offline"
USER_STATUS = "user.status"
CHANNEL_OCCUPIED = "channel.occupied"
CHANNEL_VACATED = "channel.vacated"
MEMBER_ADDED = "member.added"
MEMBER_REMOVED = "member.removed"
MESSAGE_CREATED = "message.created"
AGENT_REGISTERED = "agent.registered"
AGENT_REMOVED = "agent.removed"

EVENT_TYPES = (
    USER_ONLINE,
    USER_OFFLINE,
    USER_STATUS,
    CHANNEL_OCCUPIED,
    CHANNEL_VACATED,
    MEMBER_ADDED,
    MEMBER_REMOVED,
    MESSAGE_CREATED,
    AGENT_REGISTERED,
    AGENT_REMOVED,
)

# Sent (sender=event type, environment_id=, data=, webhook_id=) in the process that decided the
# event, as it is decided: code running inside Relay reacts without an HTTP round trip. At most
# once: a process killed at that moment never sends it (the webhook is still delivered).
event = Signal()


def new_webhook_id() -> str:
    """A fresh `webhook-id` for an event decided here."""
    return f"msg_{uuid.uuid4().hex}"


def derived_webhook_id(*parts: str) -> str:
    """The `webhook-id` of an event derived from another: the same on every re-derivation."""
    return f"msg_{uuid.uuid5(uuid.NAMESPACE_URL, 'relay:' + ':'.join(parts)).hex}"


def iso(moment: datetime) -> str:
    """An aware datetime as ISO-8601 in UTC, milliseconds."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


def iso_ms(ms: int) -> str:
    """Unix milliseconds as ISO-8601 in UTC."""
    return iso(datetime.fromtimestamp(ms / 1000, tz=UTC))


def envelope(event_type: str, timestamp: str, data: dict) -> str:
    """The body every endpoint receives for one event, as signed and sent."""
    return orjson.dumps({"type": event_type, "timestamp": timestamp, "data": data}).decode()


def send_signal(environment_id: str, event_type: str, data: dict, webhook_id: str | None = None) -> None:
    """Send the in-process signal of one event; a failing receiver never affects the event."""
    event.send_robust(sender=event_type, environment_id=environment_id, data=data, webhook_id=webhook_id)


def send_presence_signal(environment_id: str, user_id: str, state: str, last_seen_ms: int | None = None) -> None:
    """The in-process signal of a presence transition this process published."""
    if not event.receivers:
        return
    data: dict = {"user": user_id}
    if state == "offline":
        # The reaper (a dead instance's users) does not know when they were last seen: null then.
        data["last_seen_at"] = iso_ms(last_seen_ms) if last_seen_ms else None
    send_signal(environment_id, f"user.{state}", data)
