"""The log format and the event vocabulary (docs/contract.md, 6. Log vocabulary).

Events are logged as `log_event(logger, Event.PRESENCE_PUBLISHED, user=..., ...)`: the
record's message is the event name and its fields travel on the record, so tests
can assert them with `caplog` and both formatters can render them. Nothing secret
(tokens, API keys, message text, lists of channel ids) is ever passed as a field.
"""

import logging
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson

FIELDS_ATTR = "event_fields"
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


class Event(StrEnum):
    """Every event Relay logs; those docs/contract.md lists under "Log vocabulary" are contract."""

    AGENT_DEREGISTERED = "agent.deregistered"
    AGENT_FAILED = "agent.failed"
    AGENT_REGISTERED = "agent.registered"
    AGENT_REJECTED = "agent.rejected"
    AGENT_SWEEP_FAILED = "agent.sweep_failed"
    AGENT_SWEPT = "agent.swept"
    CONNECTION_CLOSED = "connection.closed"
    CONNECTION_HOOK_FAILED = "connection.hook_failed"
    CONNECTION_OPENED = "connection.opened"
    CONNECTION_REVOKED = "connection.revoked"
    CONNECTION_SLOW = "connection.slow"
    FRAME_FAILED = "frame.failed"
    LAYER_DISCONNECTED = "layer.disconnected"
    LAYER_RECONNECTED = "layer.reconnected"
    MEMBERSHIP_INVALID_EVENT = "membership.invalid_event"
    MEMBERSHIP_LISTENER_FAILED = "membership.listener_failed"
    MEMBERSHIP_NOTIFY_FAILED = "membership.notify_failed"
    MEMBERSHIP_REPAIRED = "membership.repaired"
    MESSAGE_FAILED = "message.failed"
    MESSAGE_FANOUT_FAILED = "message.fanout_failed"
    MESSAGE_INVALID_EVENT = "message.invalid_event"
    MESSAGE_RESUMED = "message.resumed"
    MESSAGE_RESUME_FAILED = "message.resume_failed"
    MESSAGE_STORED = "message.stored"
    PRESENCE_ANNOUNCED = "presence.announced"
    PRESENCE_FAILED = "presence.failed"
    PRESENCE_INVALID_PAYLOAD = "presence.invalid_payload"
    PRESENCE_PUBLISHED = "presence.published"
    PRESENCE_REPAIRED = "presence.repaired"
    PRESENCE_STATUS_EXPIRED = "presence.status_expired"
    PRESENCE_SUPPRESSED = "presence.suppressed"
    PRESENCE_VISIBILITY = "presence.visibility"
    RATE_LIMIT_FAILED = "rate_limit.failed"
    RECONCILE_FAILED = "reconcile.failed"
    RECONCILE_NOTIFY_FAILED = "reconcile.notify_failed"
    SIGNAL_INVALID_EVENT = "signal.invalid_event"
    WEBHOOK_CLAIM_FAILED = "webhook.claim_failed"
    WEBHOOK_DELIVERED = "webhook.delivered"
    WEBHOOK_ENVIRONMENTS_FAILED = "webhook.environments_failed"
    WEBHOOK_FAILED = "webhook.failed"
    WEBHOOK_INVALID_ENTRY = "webhook.invalid_entry"
    WEBHOOK_RECORD_FAILED = "webhook.record_failed"
    WEBHOOK_RELEASE_FAILED = "webhook.release_failed"
    WEBHOOK_STREAM_FAILED = "webhook.stream_failed"


def log_event(logger: logging.Logger, event: Event | str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event of the vocabulary with its fields."""
    logger.log(level, event, extra={FIELDS_ATTR: fields})


def event_fields(record: logging.LogRecord) -> dict[str, Any]:
    """Return the fields a record was logged with (empty for a plain log line)."""
    return getattr(record, FIELDS_ATTR, {})


def _timestamp(record: logging.LogRecord) -> datetime:
    return datetime.fromtimestamp(record.created, tz=UTC)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `time`, `level`, `event`, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _timestamp(record).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
        }
        if hasattr(record, FIELDS_ATTR):
            line["event"] = record.getMessage()
            line.update(event_fields(record))
        else:
            # A line from Django or a library: keep it parseable under the same shape.
            line["event"] = "log"
            line["logger"] = record.name
            line["message"] = record.getMessage()
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # orjson: a line per connect and per close is on the hot path.
        # Datetimes passed through to str() and any key allowed, as json.dumps(default=str) did.
        return orjson.dumps(line, default=str, option=_ORJSON_OPTIONS).decode()


class ConsoleFormatter(logging.Formatter):
    """Readable lines for a terminal: `14:03:01 INFO  presence.published user=linh`."""

    def format(self, record: logging.LogRecord) -> str:
        when = _timestamp(record).astimezone().strftime("%H:%M:%S")
        if hasattr(record, FIELDS_ATTR):
            fields = " ".join(f"{key}={value}" for key, value in event_fields(record).items())
            text = f"{record.getMessage()} {fields}".rstrip()
        else:
            text = f"{record.name}: {record.getMessage()}"
        line = f"{when} {record.levelname:<5} {text}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class AbandonedDisconnectFilter(logging.Filter):
    """Drops asyncio's report of a disconnect listener that Django's ASGI handler left behind.

    Django's `ASGIHandler.handle` (5.2) runs `listen_for_disconnect` beside the view and, when the
    request is cancelled while it waits on both (Daphne cancels every request in flight as it
    stops), never retrieves it: the client's disconnect then ends it with `RequestAborted`, which
    the handler ignores whenever it does retrieve it, and asyncio reports it as a traceback.
    Upstream: https://github.com/django/django/pull/19366 (the handler in a TaskGroup).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from django.core.exceptions import RequestAborted

        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, RequestAborted) and record.getMessage().startswith(UNRETRIEVED))


# How asyncio's default exception handler opens its report of a task nobody awaited.
UNRETRIEVED = "Task exception was never retrieved"
