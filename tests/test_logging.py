"""The JSON log format: one object per line with time, level, event and the fields; and what is not logged."""

import asyncio
import inspect
import json
import logging

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler

from relay.logging import UNRETRIEVED, ConsoleFormatter, JsonFormatter, log_event


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


def test_asyncio_reports_an_unretrieved_task_error_but_not_an_abandoned_disconnect_listeners(caplog):
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for error in (RequestAborted(), ValueError("boom")):
                loop.call_exception_handler({"message": UNRETRIEVED, "exception": error})
    finally:
        loop.close()
    reported = [record.exc_info[1] for record in caplog.records if record.name == "asyncio"]
    assert [type(error) for error in reported] == [ValueError]


def test_djangos_asgi_handler_still_waits_on_its_disconnect_listener_without_a_task_group():
    # The filter above answers this shape of `ASGIHandler.handle`; once Django runs the two in a
    # TaskGroup (django/django#19366), a cancelled request takes its listener with it, and the
    # filter can go.
    source = inspect.getsource(ASGIHandler.handle)
    assert "self.listen_for_disconnect(receive)" in source
    assert "asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)" in source
    assert "TaskGroup" not in source
