"""The JSON log format: one object per line with time, level, event and the fields."""

import json
import logging
import random
import time
from datetime import UTC, datetime

from relay.logging import ConsoleFormatter, JsonFormatter, iso_time, log_event


def render(formatter: logging.Formatter, emit) -> str:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("relay.test.logging")
    handler = Keep()
    logger.addHandler(handler)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return formatter.format(records[0])


def test_an_event_is_one_json_object_with_its_fields():
    line = render(
        JsonFormatter(), lambda lg: log_event(lg, "presence.published", user="linh", state="online", channels=3)
    )
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["event"] == "presence.published"
    assert parsed["level"] == "info"
    assert (parsed["user"], parsed["state"], parsed["channels"]) == ("linh", "online", 3)
    assert parsed["time"].endswith("+00:00")


def test_the_time_is_the_iso_text_datetime_gives_to_the_millisecond():
    rng = random.Random(8)
    moments = [time.time(), 0.0, 1_700_000_000.0, 1_700_000_000.9995, 1_700_000_000.9999995, 1_700_000_000.0000005]
    moments += [rng.uniform(0, 4_102_444_800) for _ in range(20_000)]
    for moment in moments:
        assert iso_time(moment) == datetime.fromtimestamp(moment, tz=UTC).isoformat(timespec="milliseconds"), moment
    assert iso_time(1_700_000_000.9999995) == "2023-11-14T22:13:21.000+00:00"
    assert iso_time(1_700_000_000.9994) == "2023-11-14T22:13:20.999+00:00"


def test_a_plain_library_line_keeps_the_same_shape():
    parsed = json.loads(render(JsonFormatter(), lambda lg: lg.warning("disk %s", "low")))
    assert (parsed["event"], parsed["level"], parsed["message"]) == ("log", "warning", "disk low")


def test_an_exception_stays_on_one_line():
    def emit(lg: logging.Logger) -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            lg.exception("failed")

    line = render(JsonFormatter(), emit)
    assert "\n" not in line
    assert "ValueError: boom" in json.loads(line)["exception"]


def test_the_console_format_is_readable():
    line = render(ConsoleFormatter(), lambda lg: log_event(lg, "connection.opened", connection_id="c1", user="linh"))
    assert line.endswith("INFO  connection.opened connection_id=c1 user=linh")
