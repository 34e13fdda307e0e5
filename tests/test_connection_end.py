"""Every way a connection ends releases it: its slot is freed and its user goes offline after the grace.

The consumer releases a connection in one place, on its way out (`GatewayConsumer.__call__`):
after a close from either side, an exception that ends it (Daphne then closes 1011), Daphne
cancelling it after its client left, or the instance stopping. Each test makes one of those
happen on a real instance and then looks from the outside: a co-member hears `offline`, and a
connection the per-user limit refused before is admitted after.

The failing handlers live in a test-only app (tests/faulty), installed by starting the instance
with DJANGO_SETTINGS_MODULE=tests.faulty_settings.
"""

import asyncio
import uuid

import pytest
from django.conf import settings

from tests.support import REFRESH, WAIT, Instance, WsClient, connect, heard, lines, logged, timings, write_lock_held

pytestmark = pytest.mark.live

FAULTY = {"DJANGO_SETTINGS_MODULE": "tests.faulty_settings"}
# Short, so that each `offline` comes within a second; the TTL stays above the refresh.
GRACE, MARGIN = 300, 100


async def refused(instance: Instance, token: str) -> int:
    """Open a socket that must be refused; return its close code."""
    client = await WsClient.open(instance.ws_url(token))
    code = await client.closed(timeout=WAIT)
    assert client.frames == []
    return code


async def test_a_failing_handler_is_answered_internal_and_logged_once_by_type(live_instances, acme, closing):
    (instance,) = live_instances(1, **FAULTY, **timings(grace=GRACE, margin=MARGIN))
    linh = await closing(connect(instance, acme, "linh"))
    await linh.send("test.fail", {"words": "linh-private-words"})
    error = await linh.next_of("error", timeout=WAIT)
    assert error == {"code": "internal", "message": "the server failed to handle this frame", "type": "test.fail"}

    # The same socket carries on.
    key = uuid.uuid4().hex
    await linh.send("message.send", {"idem_key": key, "channel": str(acme.channels["fleet"].id), "text": "hi"})
    assert (await linh.next_of("message.ack", timeout=WAIT))["idem_key"] == key
    assert linh.close_code is None

    (line,) = await logged(instance, "frame.failed")
    assert line == {"time": line["time"], "level": "error", "event": "frame.failed"} | {
        "type": "test.fail",
        "error": "RuntimeError",
    }
    log = instance.log_path.read_text()
    assert "linh-private-words" not in log
    assert "Traceback" not in log


async def test_connections_ended_by_a_crashing_handler_are_released(live_instances, acme, closing):
    (instance,) = live_instances(1, **FAULTY, **timings(grace=GRACE, margin=MARGIN, RELAY_MAX_CONNECTIONS_PER_USER=5))
    tuan = await closing(connect(instance, acme, "tuan"))
    linhs = [await closing(connect(instance, acme, "linh")) for _ in range(5)]
    assert await heard(tuan, "linh", 1) == ["online"]
    assert await refused(instance, acme.token("linh")) == 4429

    for linh in linhs:
        await linh.send("test.crash", {})
    assert [await linh.closed(timeout=WAIT) for linh in linhs] == [1011] * 5

    assert await heard(tuan, "linh", 2) == ["online", "offline"]
    sixth = await closing(connect(instance, acme, "linh"))
    assert sixth.of_type("connection.ack")[0]["user"] == "linh"
    closed = await logged(instance, "connection.closed", user="linh")
    assert len(closed) == 5


async def test_an_application_cancelled_while_its_handler_waits_is_released(live_instances, acme, closing):
    # Daphne cancels an application `--application-close-timeout` seconds after its client left,
    # if it is still running: here a `message.send` waiting for the database's write lock, which the
    # test holds. The release must run all the same (it needs Redis only, not the database).
    (instance,) = live_instances(
        1,
        args=("--application-close-timeout", "1"),
        **timings(grace=GRACE, margin=MARGIN, RELAY_MAX_CONNECTIONS_PER_USER=1),
    )
    tuan = await closing(connect(instance, acme, "tuan"))
    linh = await closing(connect(instance, acme, "linh"))
    assert await heard(tuan, "linh", 1) == ["online"]
    assert await refused(instance, acme.token("linh")) == 4429

    with write_lock_held(settings.DATABASES["default"], "chat_message"):
        fleet = str(acme.channels["fleet"].id)
        await linh.send("message.send", {"idem_key": "stuck", "channel": fleet, "text": "behind the lock"})
        await asyncio.sleep(0.3)
        await linh.close()
        assert await heard(tuan, "linh", 2) == ["online", "offline"]
        # It was the cancellation that ended it: the handler never returned.
        assert any("took too long to shut down" in line.get("message", "") for line in instance.events("log"))
        assert linh.of_type("message.ack") == []
    again = await closing(connect(instance, acme, "linh"))
    assert again.of_type("connection.ack")[0]["user"] == "linh"


async def test_an_instance_stopping_frees_its_slots_and_leaves_the_offline_to_a_survivor(live_instances, acme, closing):
    # A TTL far beyond the test's waits: a slot that frees now was freed by the stop, not expired.
    ttl = 6000
    a, b = live_instances(2, **timings(grace=GRACE, margin=MARGIN, ttl=ttl, RELAY_MAX_CONNECTIONS_PER_USER=1))
    tuan = await closing(connect(a, acme, "tuan"))
    linh = await closing(connect(b, acme, "linh"))
    assert await heard(tuan, "linh", 1) == ["online"]
    assert await refused(a, acme.token("linh")) == 4429

    b.stop()
    assert await linh.closed(timeout=WAIT) is not None
    again = await closing(connect(a, acme, "linh"))
    assert again.of_type("connection.ack")[0]["user"] == "linh"
    await again.close()
    # Nothing failed on the way down, and b published nothing after its stop.
    assert [line for line in b.events() if line["level"] in ("error", "critical")] == []
    assert "Traceback" not in b.log_path.read_text()
    assert [line["state"] for line in lines([b], "presence.published", user="linh")] == ["online"]
    # The reconnect on a and its close: a decides linh's `offline` after the grace.
    assert await heard(tuan, "linh", 2, timeout=(ttl + GRACE + REFRESH) / 1000 + WAIT) == ["online", "offline"]
