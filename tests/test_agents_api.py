"""GET /v1/agents: the key's own environment's registrations, filtered by capability on request."""

from datetime import UTC, datetime, timedelta

import pytest

from agents.actions import do_heartbeat, do_register
from relay.frames import Capability

pytestmark = pytest.mark.django_db

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def workers(acme, globex) -> None:
    """acme: linh's planner (full capability) and tuan's bare worker; globex: zed's w-1."""
    do_register(
        acme.users["linh"],
        "planner-1",
        Capability(cognition="planner", weight=0.75, family="gpt", host="box-a"),
        "c1",
        now=T0,
    )
    do_heartbeat(acme.users["linh"], "planner-1", now=T0 + timedelta(seconds=5))
    do_register(acme.users["tuan"], "w-1", Capability(family="claude"), "c2", now=T0 + timedelta(seconds=1))
    do_register(globex.users["zed"], "w-1", Capability(family="gpt"), "c3", now=T0)


def test_it_lists_the_environments_registrations_oldest_first(api_for, acme, workers):
    response = api_for(acme).call("GET", "/v1/agents")
    assert response.status_code == 200
    assert response.json() == {
        "agents": [
            {
                "instance": "planner-1",
                "identity": "linh",
                "capability": {"cognition": "planner", "weight": 0.75, "family": "gpt", "host": "box-a"},
                "registered_at": "2030-01-01T12:00:00+00:00",
                "last_seen": "2030-01-01T12:00:05+00:00",
            },
            {
                "instance": "w-1",
                "identity": "tuan",
                "capability": {"family": "claude"},
                "registered_at": "2030-01-01T12:00:01+00:00",
                "last_seen": "2030-01-01T12:00:01+00:00",
            },
        ]
    }


def test_another_tenants_rows_are_never_shown(api_for, globex, workers):
    agents = api_for(globex).call("GET", "/v1/agents").json()["agents"]
    assert [(agent["instance"], agent["identity"]) for agent in agents] == [("w-1", "zed")]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("family=gpt", ["planner-1"]),
        ("family=claude", ["w-1"]),
        ("cognition=planner", ["planner-1"]),
        ("host=box-a&family=gpt", ["planner-1"]),
        ("host=box-a&family=claude", []),
        ("host=nowhere", []),
    ],
)
def test_it_filters_by_capability(api_for, acme, workers, query, expected):
    response = api_for(acme).call("GET", f"/v1/agents?{query}")
    assert response.status_code == 200
    assert [agent["instance"] for agent in response.json()["agents"]] == expected


@pytest.mark.parametrize(
    ("query", "message_part"),
    [
        ("weight=1", "weight"),
        ("family=", "family"),
        ("family=a&family=b", "at most once"),
        ("host=" + "h" * 129, "host"),
        ("cognition=a%0Ab", "control characters"),
    ],
)
def test_a_bad_query_is_a_400_naming_the_parameter(api_for, acme, workers, query, message_part):
    response = api_for(acme).call("GET", f"/v1/agents?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_query"
    assert message_part in response.json()["error"]["message"]
    assert api_for(acme).call("GET", "/v1/agents?family=gpt").status_code == 200


def test_it_needs_an_api_key_and_only_answers_get(api_for, acme, workers):
    assert api_for(None).call("GET", "/v1/agents").status_code == 401
    assert api_for(acme).call("POST", "/v1/agents", {}).status_code == 405
    assert api_for(acme).call("GET", "/v1/agents").status_code == 200
