"""GET /v1/channels/<id>/presence a page at a time: complete, in id order, and strict about its query."""

import pytest

from presence import reads
from presence.store import presence_key
from relay.models import Membership
from tests.support import connect, http

# 30 members, every third online: m00, m03, ... m27 (10 online).
MEMBERS = [f"m{n:02d}" for n in range(30)]
ONLINE = MEMBERS[::3]


@pytest.fixture
def crowd(acme, redis_client):
    channel = acme.add_channel("crowd", "public")
    for user_id in MEMBERS:
        Membership.objects.create(channel=channel, user=acme.add_user(user_id))
    for user_id in ONLINE:
        redis_client.set(presence_key(str(acme.environment.id), user_id), "1")
    return channel


def pages(api, channel, limit: int) -> list[dict]:
    """Every page, following `next_after` from the first."""
    found, after = [], None
    while True:
        query = f"?limit={limit}" + (f"&after={after}" if after else "")
        response = api.call("GET", f"/v1/channels/{channel.id}/presence{query}")
        assert response.status_code == 200, response.content
        found.append(response.json())
        after = found[-1]["next_after"]
        if after is None:
            return found


@pytest.mark.parametrize("limit", [1, 3, 4, 10, 1000])
def test_following_next_after_gives_every_online_member_once_in_order(crowd, acme, api_for, limit):
    found = pages(api_for(acme), crowd, limit)
    assert [user for page in found for user in page["online"]] == ONLINE
    assert all(len(page["online"]) <= limit for page in found)
    assert {page["channel"] for page in found} == {str(crowd.id)}
    # A page stops at the last online member it holds, so no page but a last one can come back empty.
    assert all(page["online"] for page in found[:-1])


def test_without_a_query_one_page_holds_up_to_1000_and_says_nothing_is_left(crowd, acme, api_for):
    body = api_for(acme).call("GET", f"/v1/channels/{crowd.id}/presence").json()
    assert body == {"channel": str(crowd.id), "online": ONLINE, "next_after": None}


def test_the_last_online_member_on_a_full_page_still_names_the_next_page_when_members_follow(
    crowd, acme, api_for, monkeypatch
):
    # The page fills on m27 while m28 and m29 (offline) follow: a next page exists, and it is empty.
    monkeypatch.setattr(reads, "MEMBERS_PER_READ", 4)
    found = pages(api_for(acme), crowd, 10)
    assert [page["next_after"] for page in found] == ["m27", None]
    assert found[1]["online"] == []


def test_after_need_not_be_a_member_and_pages_start_behind_it(crowd, acme, api_for):
    body = api_for(acme).call("GET", f"/v1/channels/{crowd.id}/presence?after=m10&limit=2").json()
    assert (body["online"], body["next_after"]) == (["m12", "m15"], "m15")
    body = api_for(acme).call("GET", f"/v1/channels/{crowd.id}/presence?after=zz").json()
    assert (body["online"], body["next_after"]) == ([], None)


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=1001", "limit=abc", "limit=-1", "limit=1.5", "limit=%D9%A3", "after=", "after=a%07b",
     "after=" + "x" * 129, "after=m01&after=m02"],
)  # fmt: skip
def test_a_bad_limit_or_after_is_a_400_that_names_it(crowd, acme, api_for, query):
    response = api_for(acme).call("GET", f"/v1/channels/{crowd.id}/presence?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_query" and query.split("=")[0] in error["message"]


def test_another_tenants_channel_is_a_404_whatever_the_query(crowd, acme, globex, api_for):
    assert api_for(globex).call("GET", f"/v1/channels/{crowd.id}/presence?limit=1").status_code == 404
    assert api_for(globex).call("GET", f"/v1/channels/{crowd.id}/presence?limit=0").status_code == 404


def test_the_page_parameters_are_in_the_openapi_document(client):
    operation = client.get("/v1/openapi.json").json()["paths"]["/v1/channels/{channel_id}/presence"]["get"]
    parameters = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
    assert parameters["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1000}
    assert parameters["after"]["schema"]["maxLength"] == 128 and not parameters["after"]["required"]


@pytest.mark.live
async def test_two_instances_page_the_same_real_connections(live_instances, acme, closing):
    a, b = live_instances(2)
    general = str(acme.channels["general"].id)
    await closing(connect(a, acme, "linh"))
    await closing(connect(b, acme, "tuan"))
    for instance in (a, b):
        status, first = http("GET", f"{instance.http_url}/v1/channels/{general}/presence?limit=1", api_key=acme.api_key)
        assert (status, first["online"], first["next_after"]) == (200, ["linh"], "linh")
        status, second = http(
            "GET", f"{instance.http_url}/v1/channels/{general}/presence?limit=1&after=linh", api_key=acme.api_key
        )
        assert (status, second["online"], second["next_after"]) == (200, ["tuan"], None)
