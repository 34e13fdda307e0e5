"""Liveness: rows unseen for RELAY_AGENT_TTL_MS are aged out; heartbeating ones stay. No test sleeps for a TTL."""

import threading
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from channels.db import database_sync_to_async
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection
from prometheus_client import REGISTRY

from agents import actions
from agents import sweeper as agents_sweeper
from agents.actions import do_heartbeat, do_register, sweep_stale
from agents.models import Registration
from agents.sweeper import Sweeper, sweeper
from relay.frames import Capability
from tests.support import T0, ManualClock, events, next_frame, open_communicator

TTL = timedelta(milliseconds=30_000)


def register(tenant, user_id: str, instance: str, at: datetime = T0) -> Registration:
    return do_register(tenant.users[user_id], instance, Capability(), "conn-1", now=at)[0]


def swept_total() -> float:
    return REGISTRY.get_sample_value("relay_agent_swept_total") or 0.0


def instances() -> set[str]:
    return set(Registration.objects.values_list("instance", flat=True))


@pytest.mark.django_db
def test_the_sweep_removes_silent_rows_and_keeps_heartbeating_ones(acme, settings, caplog):
    settings.RELAY_AGENT_TTL_MS = 30_000
    register(acme, "linh", "silent")
    register(acme, "linh", "beating")
    do_heartbeat(acme.users["linh"], "beating", now=T0 + timedelta(seconds=20))
    before = swept_total()

    swept = sweep_stale(now=T0 + TTL + timedelta(seconds=1))

    assert swept == [(str(acme.environment.id), "silent")]
    assert instances() == {"beating"}
    logged = events(caplog, "agent.swept")
    assert logged == [{"instance": "silent", "environment": str(acme.environment.id)}]
    assert swept_total() == before + 1


@pytest.mark.django_db
def test_a_row_is_alive_up_to_the_ttl_itself(acme, settings):
    settings.RELAY_AGENT_TTL_MS = 30_000
    register(acme, "linh", "w-1")
    assert sweep_stale(now=T0 + TTL) == []
    assert instances() == {"w-1"}
    assert sweep_stale(now=T0 + TTL + timedelta(milliseconds=1)) == [(str(acme.environment.id), "w-1")]
    assert instances() == set()


@pytest.mark.django_db
def test_the_sweep_reaches_every_tenant_and_works_in_batches(acme, globex, monkeypatch):
    monkeypatch.setattr(actions, "SWEEP_BATCH", 2)
    for number in range(3):
        register(acme, "linh", f"a-{number}")
        register(globex, "zed", f"g-{number}")
    register(acme, "tuan", "fresh", at=T0 + TTL)

    swept = sweep_stale(now=T0 + TTL + timedelta(seconds=1), ttl_ms=30_000)

    assert sorted(instance for _, instance in swept) == ["a-0", "a-1", "a-2", "g-0", "g-1", "g-2"]
    assert instances() == {"fresh"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_sweeps_remove_and_log_each_row_once(acme, caplog):
    for number in range(40):
        register(acme, "linh", f"w-{number}")
    register(acme, "tuan", "beating", at=T0 + TTL)
    results: list[list] = []
    start = threading.Barrier(3)

    def sweep_in_its_own_connection() -> None:
        try:
            start.wait()
            results.append(sweep_stale(now=T0 + TTL + timedelta(seconds=1), ttl_ms=30_000))
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep_in_its_own_connection) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(results) == 3
    removed = [instance for result in results for _, instance in result]
    assert sorted(removed) == sorted(f"w-{number}" for number in range(40))
    logged = [e["instance"] for e in events(caplog, "agent.swept")]
    assert sorted(logged) == sorted(removed)
    assert instances() == {"beating"}


@pytest.mark.django_db
def test_sweepagents_does_one_sweep_for_cron(acme):
    register(acme, "linh", "old", at=datetime.now(UTC) - timedelta(hours=1))
    register(acme, "linh", "new", at=datetime.now(UTC))
    out = StringIO()
    call_command("sweepagents", stdout=out)
    assert out.getvalue().strip() == "Removed 1 stale agent registration(s)."
    assert instances() == {"new"}
    call_command("sweepagents", "--ttl-ms", "1", stdout=out)
    assert instances() == set()


@pytest.mark.django_db
def test_sweepagents_refuses_a_ttl_below_one_and_removes_nothing(acme):
    register(acme, "linh", "old", at=datetime.now(UTC) - timedelta(hours=1))
    with pytest.raises(CommandError, match="at least 1"):
        call_command("sweepagents", "--ttl-ms", "0", stdout=StringIO())
    assert instances() == {"old"}


# ── the per-instance periodic sweep ──────────────────────────────────────────
# database_sync_to_async, not the async ORM: it closes its connection after each call, so
# PostgreSQL can drop the test database at the end of the session.
registered = database_sync_to_async(instances)


@pytest.fixture
def sweep_clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """When the sweeps run, moved by hand: a sweep runs only when the test advances past the interval."""
    clock = ManualClock()
    monkeypatch.setattr(agents_sweeper, "clock", clock)
    return clock


@pytest.mark.django_db(transaction=True)
async def test_a_connection_starts_the_periodic_sweep_which_ages_out_silent_workers(
    acme, settings, agents_clock, sweep_clock
):
    settings.RELAY_AGENT_TTL_MS = 30_000
    settings.RELAY_AGENT_SWEEP_MS = 10_000
    linh = await open_communicator(acme.token("linh"))
    await next_frame(linh)
    for instance in ("silent", "beating"):
        await linh.send_json_to({"type": "register", "payload": {"instance": instance}})
        assert (await next_frame(linh))["type"] == "register.ack"
    rounds = sweeper().rounds
    assert rounds.armed

    agents_clock.now = T0 + timedelta(seconds=20)
    await linh.send_json_to({"type": "heartbeat", "payload": {"instance": "beating"}})
    await linh.send_json_to({"type": "register", "payload": {"instance": "probe"}})
    await next_frame(linh)
    agents_clock.now = T0 + TTL + timedelta(seconds=1)
    # Stale now, and still there until the sweep's interval has passed.
    sweep_clock.advance(9.999)
    await rounds.settled()
    assert await registered() == {"silent", "beating", "probe"}
    sweep_clock.advance(0.001)
    await rounds.settled()
    assert await registered() == {"beating", "probe"}

    # The disconnect removes nothing; only the sweep does.
    await linh.disconnect()
    assert await registered() == {"beating", "probe"}
    await sweeper().stop()
    assert not rounds.armed


@pytest.mark.django_db(transaction=True)
async def test_a_failing_sweep_is_logged_and_the_next_one_runs(
    acme, settings, agents_clock, sweep_clock, monkeypatch, caplog
):
    settings.RELAY_AGENT_SWEEP_MS = 1_000
    settings.RELAY_AGENT_TTL_MS = 30_000
    await database_sync_to_async(register)(acme, "linh", "silent")
    agents_clock.now = T0 + TTL + timedelta(seconds=1)
    working = actions.sweep_stale
    failures = []

    def busy_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError("database is locked")
        return working(*args, **kwargs)

    monkeypatch.setattr(actions, "sweep_stale", busy_once)
    own = Sweeper()
    own.ensure_running()
    try:
        sweep_clock.advance(1.0)
        await own.rounds.settled()
        assert await registered() == {"silent"}
        assert events(caplog, "agent.sweep_failed") == [{"error": "OperationalError"}]
        sweep_clock.advance(1.0)
        await own.rounds.settled()
        assert await registered() == set()
    finally:
        await own.stop()
    assert [e["instance"] for e in events(caplog, "agent.swept")] == ["silent"]


@pytest.mark.django_db(transaction=True)
async def test_stopping_the_sweeper_lets_its_sweep_finish_and_it_can_start_again(acme, settings, sweep_clock):
    settings.RELAY_AGENT_SWEEP_MS = 10_000
    own = Sweeper()
    own.ensure_running()
    own.ensure_running()  # one sweep per loop however many connections open
    sweep_clock.advance(10.0)
    sweeping = own.rounds.running
    assert sweeping is not None
    await own.stop()
    assert sweeping.done() and not sweeping.cancelled()
    assert not own.rounds.armed
    sweep_clock.advance(100.0)
    assert own.rounds.running is None  # stopped: no timer left to fire
    own.ensure_running()
    assert own.rounds.armed
    await own.stop()
