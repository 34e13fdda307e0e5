"""The log format and the event vocabulary (CONTRACT.md section 6).

Events are logged as `log_event(logger, "presence.published", user=..., ...)`: the
record's message is the event name and its fields travel on the record, so tests
can assert them with `caplog` and both formatters can render them. Nothing secret
(tokens, API keys, message text, lists of channel ids) is ever passed as a field.
"""

import functools
import logging
import math
from datetime import UTC, datetime
from typing import Any

import orjson

FIELDS_ATTR = "event_fields"
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event of the vocabulary with its fields."""
    logger.log(level, event, extra={FIELDS_ATTR: fields})


def event_fields(record: logging.LogRecord) -> dict[str, Any]:
    """Return the fields a record was logged with (empty for a plain log line)."""
    return getattr(record, FIELDS_ATTR, {})


def _timestamp(record: logging.LogRecord) -> datetime:
    return datetime.fromtimestamp(record.created, tz=UTC)


def iso_time(created: float) -> str:
    """`created` as `datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")` gives it.

    Built from the second's text, made once a second: the datetime and its formatting were
    ≈ 1.6 µs of a JSON line's ≈ 8, and every connect writes two (docs/performance.md). Rounded
    to the microsecond as datetime rounds, then cut to the millisecond as isoformat cuts.
    """
    fraction, second = math.modf(created)
    microseconds = round(fraction * 1_000_000)
    if microseconds >= 1_000_000:
        second, microseconds = second + 1, microseconds - 1_000_000
    return f"{_iso_second(int(second))}.{microseconds // 1000:03d}+00:00"


@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `time`, `level`, `event`, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": iso_time(record.created),
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
        # orjson: one line per connect and close is on the hot path (docs/performance.md).
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
