"""A connect's one database hop: shared by the connects waiting for it, one query per table."""

import asyncio
import json

import pytest
from channels.testing import WebsocketCommunicator
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from presence.extension import PresenceExtension
from relay import connect_reads, registry
from relay.asgi import application
from relay.exceptions import InvalidToken
from relay.models import User
from relay.tokens import verify_token
from tests.support import events

pytestmark = pytest.mark.usefixtures("empty_secret_cache")


@pytest.mark.django_db(transaction=True)
async def test_connects_waiting_for_the_database_hop_share_the_next_one(acme, monkeypatch):
    hops: list[list] = []
    read_in_worker = connect_reads._read_in_worker

    async def a_slow_first_hop(reads):
        hops.append([token for token, _ in reads])
        if len(hops) == 1:
            await asyncio.sleep(0.3)  # the others arrive meanwhile
        return await read_in_worker(reads)

    monkeypatch.setattr(connect_reads, "_read_in_worker", a_slow_first_hop)
    tokens = [acme.token("linh"), acme.token("tuan"), "forged", acme.token("hermit")]
    communicators = [WebsocketCommunicator(application, f"/v1/ws?token={token}") for token in tokens]
    first = asyncio.ensure_future(communicators[0].connect(timeout=5))
    await asyncio.sleep(0.1)
    await asyncio.gather(*(communicator.connect(timeout=5) for communicator in communicators[1:]))
    await first
    # One hop for the first connect, ONE for the three that came while it was in flight.
    assert hops == [[tokens[0]], tokens[1:]]
    # Each got its own outcome: the forged one alone is refused.
    outputs = [await communicator.receive_output(timeout=5) for communicator in communicators]
    outcomes = [
        json.loads(output["text"])["payload"]["user"] if output["type"] == "websocket.send" else output["code"]
        for output in outputs
    ]
    assert outcomes == ["linh", "tuan", 4401, "hermit"]
    for communicator in communicators:
        await communicator.disconnect()


def _presence() -> PresenceExtension:
    return next(ext for ext in registry.extensions if isinstance(ext, PresenceExtension))


def test_a_hop_reads_its_connects_users_channels_and_co_members_with_one_query_each(acme, globex):
    acme.add_user("solo")
    acme.add_channel("den", "private", members=("hermit", "solo"))
    presence = _presence()
    reads = [
        (acme.token("linh"), [presence]),
        (acme.token("hermit"), [presence]),
        ("forged", [presence]),
        (acme.token("nobody"), [presence]),
        (globex.token("linh"), [presence]),
        (acme.token("tuan"), []),
        (acme.token("linh"), [presence]),  # her second device, in the same batch
    ]
    with CaptureQueriesContext(connection) as queries:
        linh, hermit, forged, nobody, globex_linh, tuan, linh_again = connect_reads._read_connects(reads)
    # Each connect gets its own user, channels and co-members, never another's of the batch.
    assert (linh.user.external_id, linh.user.environment) == ("linh", acme.environment)
    assert linh.channel_ids == {str(acme.channels["fleet"].id), str(acme.channels["general"].id)}
    assert linh.loaded[presence] == ["linh", "tuan"]
    assert hermit.channel_ids == {str(acme.channels["den"].id)}
    assert hermit.loaded[presence] == ["hermit", "solo"]
    assert (globex_linh.user.environment, globex_linh.loaded[presence]) == (globex.environment, ["linh", "zed"])
    assert tuan.channel_ids == linh.channel_ids and presence not in tuan.loaded
    assert linh_again.user.pk == linh.user.pk
    assert (linh_again.channel_ids, linh_again.loaded) == (linh.channel_ids, linh.loaded)
    assert isinstance(forged, InvalidToken) and isinstance(nobody, InvalidToken)
    # One read of the users per environment, one of all their channels, one of those channels' members.
    reads_sql = [query["sql"] for query in queries.captured_queries if '"relay_environment"' not in query["sql"]]
    assert [sql.split(" FROM ")[1].split()[0] for sql in reads_sql] == [
        '"relay_user"',
        '"relay_user"',
        '"relay_membership"',
        '"relay_membership"',
    ]


def test_a_database_error_fails_the_hops_verified_connects_and_a_forged_token_stays_refused(acme, monkeypatch):
    def unavailable(user_pks):
        raise OperationalError("database is locked")

    monkeypatch.setattr(connect_reads, "channel_ids_of_users", unavailable)
    linh, forged = connect_reads._read_connects([(acme.token("linh"), []), ("forged", [])])
    assert isinstance(linh, OperationalError)
    assert isinstance(forged, InvalidToken)


def test_a_failing_load_is_logged_and_its_connects_open_without_it(acme, monkeypatch, caplog):
    presence = _presence()

    def broken(sessions):
        raise OperationalError("database is locked")

    monkeypatch.setattr(presence, "load", broken)
    (linh,) = connect_reads._read_connects([(acme.token("linh"), [presence])])
    assert linh.user.external_id == "linh" and presence not in linh.loaded
    failures = events(caplog, "connection.hook_failed")
    assert failures == [{"hook": "PresenceExtension.load", "error": "OperationalError"}]


def test_a_connect_reads_the_users_ids_only_and_the_rest_loads_on_first_access(acme):
    with CaptureQueriesContext(connection) as connect:
        user = verify_token(acme.token("linh"))
    stored = User.objects.get(pk=user.pk)
    assert (user.environment_id, user.external_id) == (stored.environment_id, stored.external_id)
    assert user.environment == acme.environment  # the cached environment, no query
    assert user.get_deferred_fields() == {"name", "created_at", "membership_version"}
    assert [query["sql"].count('"relay_user"."name"') for query in connect.captured_queries] == [0, 0]
    assert (user.name, user.created_at, user.membership_version) == (
        stored.name,
        stored.created_at,
        stored.membership_version,
    )
    assert user.get_deferred_fields() == set()
