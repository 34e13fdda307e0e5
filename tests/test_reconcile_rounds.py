"""The reconciliation's rounds on a clock moved by hand: a lost notice is repaired at the round, not before."""

import sqlite3

import pytest
from channels.db import database_sync_to_async
from django.db import connection

from relay import membership, reconcile
from relay.queries import channel_ids_of_users, membership_versions, versioned_channel_ids
from tests.support import ManualClock, Socket, events, until

INTERVAL = 10.0


@pytest.fixture
def reconcile_clock(monkeypatch: pytest.MonkeyPatch, settings) -> ManualClock:
    """When this loop's reconciliation rounds run, moved by hand."""
    settings.RELAY_PRESENCE_REFRESH_MS = int(INTERVAL * 1000)
    clock = ManualClock()
    monkeypatch.setattr(reconcile, "clock", clock)
    return clock


@pytest.fixture
def lost_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Membership notices dropped on arrival, as pub/sub drops them while a subscriber reconnects."""
    monkeypatch.setattr(membership.MembershipBus, "received", lambda self, message: None)


async def a_round(clock: ManualClock, seconds: float = INTERVAL) -> None:
    clock.advance(seconds)
    await reconcile.reconciler().rounds.settled()


@pytest.mark.django_db(transaction=True)
async def test_a_lost_removal_is_repaired_at_the_next_round_and_not_before(
    acme, reconcile_clock, lost_notices, caplog, close_presence_service, closing
):
    await closing(Socket.open(acme.token("linh")))
    await a_round(reconcile_clock)  # a new connection's first round reads once
    assert events(caplog, "membership.repaired") == []

    await database_sync_to_async(membership.remove_member)(acme.channels["fleet"], acme.users["linh"])
    await a_round(reconcile_clock, INTERVAL - 0.001)
    assert events(caplog, "membership.repaired") == []
    await a_round(reconcile_clock, 0.001)
    await until(lambda: events(caplog, "membership.repaired"))
    repaired = events(caplog, "membership.repaired")
    assert [(line["user"], line["added"], line["removed"]) for line in repaired] == [("linh", 0, 1)]


@pytest.mark.django_db(transaction=True)
async def test_the_rounds_stop_with_the_last_connection_and_start_with_the_next(
    acme, reconcile_clock, close_presence_service, closing
):
    rounds = reconcile.reconciler().rounds
    assert not rounds.armed
    linh = await closing(Socket.open(acme.token("linh")))
    assert rounds.armed
    await linh.close()
    await a_round(reconcile_clock)  # the round that finds nobody left schedules no other
    assert not rounds.armed
    await closing(Socket.open(acme.token("tuan")))
    assert rounds.armed


def parameters_per_query() -> int:
    """The most parameters one statement may carry on the test database."""
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        # 32,766 by default; some builds (Debian's) raise it.
        return connection.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return 65_535  # PostgreSQL's, where parameters are bound by the server


@pytest.mark.django_db
def test_a_rounds_reads_take_more_users_than_one_query_has_parameters(acme):
    # The ids of every connected user, past what one statement may carry.
    linh, tuan = acme.users["linh"], acme.users["tuan"]
    for user in (linh, tuan):
        user.refresh_from_db()
    assert linh.membership_version == 2  # one bump for each of the two memberships the cast starts with
    many = [*range(10**9, 10**9 + parameters_per_query() + 1), linh.pk, tuan.pk]
    fleet, general = str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    assert channel_ids_of_users(many) == {linh.pk: {fleet, general}, tuan.pk: {fleet, general}}
    assert membership_versions(many) == {linh.pk: linh.membership_version, tuan.pk: tuan.membership_version}
    versioned = versioned_channel_ids(many)
    assert versioned[linh.pk] == (linh.membership_version, {fleet, general})
    assert set(versioned) == {linh.pk, tuan.pk}
