"""GET /v1/channels/<id>/messages: a channel's history, paginated by seq, behind the tenant wall."""

from datetime import UTC, datetime, timedelta

import pytest

from chat.actions import send_message
from relay.tokens import mint_token
from tests.chat_helpers import store_history
from tests.conftest import ApiClient

pytestmark = pytest.mark.django_db


def history(api, channel_id: str, query: str = ""):
    return api.call("GET", f"/v1/channels/{channel_id}/messages{query}")


def test_history_pages_through_a_channel_in_seq_order(acme, api_for):
    fleet = acme.channels["fleet"]
    store_history(fleet, acme.users["tuan"], 5)
    api = api_for(acme)

    pages, after = [], 0
    while after is not None:
        response = history(api, fleet.id, f"?after={after}&limit=2")
        assert response.status_code == 200
        pages.append([m["seq"] for m in response.json()["messages"]])
        after = response.json()["next_after"]

    assert pages == [[1, 2], [3, 4], [5]]


def test_history_items_have_the_message_created_shape(acme, api_for):
    fleet = acme.channels["fleet"]
    sent = send_message(acme.users["linh"], str(fleet.id), "k", "hello")

    body = history(api_for(acme), fleet.id).json()

    assert body == {"channel": str(fleet.id), "messages": [sent.message], "next_after": None}
    assert set(sent.message) == {"id", "channel", "seq", "user", "text", "created_at"}


def test_history_defaults_to_the_first_hundred(acme, api_for):
    fleet = acme.channels["fleet"]
    store_history(fleet, acme.users["tuan"], 101)

    body = history(api_for(acme), fleet.id).json()

    assert [m["seq"] for m in body["messages"]] == list(range(1, 101))
    assert body["next_after"] == 100


@pytest.mark.parametrize(
    "query",
    ["?after=-1", "?after=abc", "?after=1.5", "?after=", "?after=%D9%A1", "?limit=0", "?limit=501", "?limit=ten"],
)
def test_bad_paging_values_are_a_400_naming_the_parameter(acme, api_for, query):
    fleet = acme.channels["fleet"]
    store_history(fleet, acme.users["tuan"], 3)
    api = api_for(acme)

    response = history(api, fleet.id, query)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_query"
    assert query[1:].split("=")[0] in error["message"]
    assert [m["seq"] for m in history(api, fleet.id, "?after=1&limit=500").json()["messages"]] == [2, 3]


def test_another_tenants_channel_is_not_found(acme, globex, api_for):
    board = globex.channels["board"]
    store_history(board, globex.users["zed"], 2)

    for channel_id in (board.id, "00000000-0000-4000-8000-000000000000", "not-a-uuid"):
        response = history(api_for(acme), channel_id)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "channel_not_found"
    assert len(history(api_for(globex), board.id).json()["messages"]) == 2


def test_history_needs_an_api_key(acme, api_for):
    fleet = acme.channels["fleet"]
    assert history(api_for(None), fleet.id).status_code == 401
    assert history(api_for(acme), fleet.id).status_code == 200


def token_reader(tenant, user_id: str) -> ApiClient:
    """A client holding only a connection token, as a Relay client does."""
    return ApiClient(tenant.token(user_id))


def test_a_member_reads_history_with_their_connection_token(acme, globex):
    fleet = acme.channels["fleet"]
    store_history(fleet, acme.users["tuan"], 3)

    response = history(token_reader(acme, "linh"), fleet.id, "?after=1")

    assert response.status_code == 200
    assert [m["seq"] for m in response.json()["messages"]] == [2, 3]


def test_a_connection_token_reads_no_channel_its_user_is_not_in(acme, globex):
    fleet = acme.channels["fleet"]
    store_history(fleet, acme.users["tuan"], 1)

    # hermit is in no channel; globex's linh is another tenant's user with the same id.
    for reader in (token_reader(acme, "hermit"), token_reader(globex, "linh")):
        response = history(reader, fleet.id)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "channel_not_found"
    assert len(history(token_reader(acme, "tuan"), fleet.id).json()["messages"]) == 1


def test_a_forged_or_expired_token_reads_nothing(acme):
    fleet = acme.channels["fleet"]
    forged = acme.token("linh")[:-4] + "AAAA"
    expired, _ = mint_token(acme.environment, "linh", 60, now=datetime.now(UTC) - timedelta(hours=1))

    for credential in (forged, expired, "not-a-token"):
        response = history(ApiClient(credential), fleet.id)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
    assert history(token_reader(acme, "linh"), fleet.id).status_code == 200
