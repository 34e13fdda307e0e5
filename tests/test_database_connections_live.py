"""An instance keeps no database connection open behind the HTTP requests it answered.

Django's ASGI handler runs each request's sync code in a context of its own, so a connection
kept for reuse (CONN_MAX_AGE) is never reused: left open, each request would leave one behind,
three file descriptors each with SQLite (the file, its WAL, its shared memory), until the
instance runs out of them.
"""

import os

import pytest

from tests.support import Instance, http, timings

pytestmark = pytest.mark.live

REQUESTS = 60


def open_descriptors(instance: Instance) -> int:
    return len(os.listdir(f"/proc/{instance.process.pid}/fd"))


def test_a_run_of_api_calls_leaves_no_database_connection_behind(live_instances, acme):
    [gateway] = live_instances(1, **timings())
    users = f"{gateway.http_url}/v1/users"
    # The first request opens what an instance keeps for good (imports, the first connection).
    assert http("POST", users, {"id": "warm-up"}, acme.api_key)[0] == 201
    before = open_descriptors(gateway)

    answers = [http("POST", users, {"id": f"user-{index}"}, acme.api_key)[0] for index in range(REQUESTS)]

    assert answers == [201] * REQUESTS
    # A few descriptors come and go with the sockets of the moment; one per request is a leak.
    assert open_descriptors(gateway) - before < REQUESTS // 4
