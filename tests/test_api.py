"""The HTTP API: happy paths, every error path, and the tenant wall (docs/contract.md, 2. HTTP API)."""

import uuid

import pytest

from relay.models import ApiKey, Channel, Membership, User
from relay.tokens import verify_token

pytestmark = pytest.mark.django_db


def error_code(response) -> str:
    return response.json()["error"]["code"]


# ── authentication ───────────────────────────────────────────────────────────
def test_a_call_without_a_key_is_401_and_with_the_key_succeeds(acme, api_for):
    assert api_for(acme).call("POST", "/v1/users", {"id": "mai"}).status_code == 201
    response = api_for(None).call("POST", "/v1/users", {"id": "an"})
    assert response.status_code == 401
    assert error_code(response) == "unauthorized"
    assert not User.objects.filter(external_id="an").exists()


def test_an_unknown_key_is_401(acme, api_for):
    response = api_for(None).client.post(
        "/v1/users", data={"id": "an"}, content_type="application/json", headers={"Authorization": "Bearer rk_nope"}
    )
    assert response.status_code == 401


def test_a_revoked_key_is_401(acme, api_for):
    assert api_for(acme).call("GET", "/v1/channels").status_code == 200
    ApiKey.objects.update(revoked_at="2026-01-01T00:00:00Z")
    assert api_for(acme).call("GET", "/v1/channels").status_code == 401


def test_keys_are_stored_hashed_with_a_visible_prefix(acme):
    key = ApiKey.objects.get(environment=acme.environment)
    assert acme.api_key.startswith(key.prefix)
    assert acme.api_key not in (key.digest, key.prefix)


# ── users ────────────────────────────────────────────────────────────────────
def test_creating_a_user_is_201_and_again_is_an_update_with_200(acme, api_for):
    api = api_for(acme)
    created = api.call("POST", "/v1/users", {"id": "mai", "name": "Mai"})
    assert (created.status_code, created.json()) == (201, {"id": "mai", "name": "Mai"})
    again = api.call("POST", "/v1/users", {"id": "mai", "name": "Mai Anh"})
    assert (again.status_code, again.json()) == (200, {"id": "mai", "name": "Mai Anh"})
    assert User.objects.filter(environment=acme.environment, external_id="mai").count() == 1


def test_the_same_user_id_in_two_tenants_is_two_users(acme, globex, api_for):
    assert api_for(acme).call("POST", "/v1/users", {"id": "mai"}).status_code == 201
    assert api_for(globex).call("POST", "/v1/users", {"id": "mai"}).status_code == 201
    assert User.objects.filter(external_id="mai").count() == 2


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"id": ""},
        {"id": "x" * 129},
        {"id": 17},
        {"id": "bad\nid"},
        {"id": "mai", "name": 3},
        {"id": "mai", "role": "admin"},
        {"id": None},
        {"id": "mai", "name": "Mai\x00"},
        {"id": "mai", "name": "Mai\n"},
    ],
)
def test_a_bad_user_body_is_400_and_creates_nothing(acme, api_for, body):
    before = User.objects.count()
    response = api_for(acme).call("POST", "/v1/users", body)
    assert response.status_code == 400
    assert error_code(response) == "invalid_body"
    assert response.json()["error"]["message"]
    assert User.objects.count() == before
    assert api_for(acme).call("POST", "/v1/users", {"id": "mai"}).status_code == 201


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", '"mai"', "", "{"])
def test_a_body_that_is_not_a_json_object_is_400(acme, api_for, raw):
    response = api_for(acme).call("POST", "/v1/users", raw=raw)
    assert response.status_code == 400
    assert error_code(response) in {"invalid_json", "invalid_body"}


@pytest.mark.parametrize(
    "raw",
    [
        '{"id": "mai", "name": ' + "1" * 5000 + "}",
        "[" * 5000 + "]" * 5000,
        '{"id": "mai", "name": "\\ud800"}',
        '{"id": "mai", "name": NaN}',
    ],
    ids=["integer-of-5000-digits", "nested-5000-deep", "lone-surrogate", "nan"],
)
def test_json_that_python_would_choke_on_is_400_and_creates_nothing(acme, api_for, raw):
    response = api_for(acme).call("POST", "/v1/users", raw=raw)
    assert response.status_code == 400
    assert error_code(response) in {"invalid_json", "invalid_body"}
    assert not User.objects.filter(external_id="mai").exists()
    assert api_for(acme).call("POST", "/v1/users", raw='{"id": "mai", "name": "Mai"}').status_code == 201


def test_a_wrong_method_is_405(acme, api_for):
    response = api_for(acme).call("DELETE", "/v1/users")
    assert response.status_code == 405
    assert response["Allow"] == "POST"


# ── channels and members ─────────────────────────────────────────────────────
def test_creating_a_channel_returns_its_uuid(acme, api_for):
    response = api_for(acme).call("POST", "/v1/channels", {"name": "ops", "type": "private"})
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "ops" and body["type"] == "private"
    assert Channel.objects.get(id=uuid.UUID(body["id"])).environment == acme.environment


def test_listing_channels_shows_only_the_tenants_own(acme, globex, api_for):
    names = {c["name"] for c in api_for(acme).call("GET", "/v1/channels").json()["channels"]}
    assert names == {"fleet", "general"}


@pytest.mark.parametrize(
    "body", [{"name": "ops", "type": "secret"}, {"name": ""}, {"type": "public"}, {"name": "ops", "type": 1}]
)
def test_a_bad_channel_body_is_400_and_creates_nothing(acme, api_for, body):
    before = Channel.objects.count()
    response = api_for(acme).call("POST", "/v1/channels", body)
    assert response.status_code == 400
    assert Channel.objects.count() == before


def test_adding_a_member_is_201_then_200(acme, api_for):
    channel = acme.channels["fleet"]
    api = api_for(acme)
    assert api.call("PUT", f"/v1/channels/{channel.id}/members/hermit").status_code == 201
    assert api.call("PUT", f"/v1/channels/{channel.id}/members/hermit").status_code == 200
    assert Membership.objects.filter(channel=channel, user=acme.users["hermit"]).count() == 1


def test_removing_a_member_is_204(acme, api_for):
    channel = acme.channels["fleet"]
    response = api_for(acme).call("DELETE", f"/v1/channels/{channel.id}/members/tuan")
    assert response.status_code == 204
    assert not Membership.objects.filter(channel=channel, user=acme.users["tuan"]).exists()
    assert Membership.objects.filter(channel=channel, user=acme.users["linh"]).exists()


@pytest.mark.parametrize("user_id", ["li%00nh", "li%01nh", "x" * 129])
def test_a_member_id_no_user_can_have_is_404_and_adds_nothing(acme, api_for, user_id):
    channel = acme.channels["general"].id
    before = Membership.objects.count()
    response = api_for(acme).call("PUT", f"/v1/channels/{channel}/members/{user_id}")
    assert response.status_code == 404
    assert error_code(response) == "user_not_found"
    assert Membership.objects.count() == before
    assert api_for(acme).call("PUT", f"/v1/channels/{channel}/members/hermit").status_code == 201


def test_members_of_unknown_channels_or_users_are_404(acme, api_for):
    api = api_for(acme)
    channel = acme.channels["fleet"]
    assert error_code(api.call("PUT", f"/v1/channels/{uuid.uuid4()}/members/linh")) == "channel_not_found"
    assert error_code(api.call("PUT", "/v1/channels/not-a-uuid/members/linh")) == "channel_not_found"
    assert error_code(api.call("PUT", f"/v1/channels/{channel.id}/members/nobody")) == "user_not_found"
    assert api.call("PUT", f"/v1/channels/{channel.id}/members/hermit").status_code == 201


# ── tokens ───────────────────────────────────────────────────────────────────
def test_minting_a_token_for_a_user(acme, api_for):
    response = api_for(acme).call("POST", "/v1/tokens", {"user": "linh", "ttl_seconds": 600})
    assert response.status_code == 201
    body = response.json()
    assert verify_token(body["token"]).external_id == "linh"
    assert body["expires_at"].endswith("+00:00")


@pytest.mark.parametrize(
    "body", [{"user": "linh", "ttl_seconds": 0}, {"user": "linh", "ttl_seconds": "60"}, {"user": ""}, {}]
)
def test_a_bad_token_body_is_400(acme, api_for, body):
    assert api_for(acme).call("POST", "/v1/tokens", body).status_code == 400


def test_a_token_for_an_unknown_user_is_404(acme, api_for):
    response = api_for(acme).call("POST", "/v1/tokens", {"user": "nobody"})
    assert (response.status_code, error_code(response)) == (404, "user_not_found")


# ── the tenant wall ──────────────────────────────────────────────────────────
def test_another_tenant_cannot_touch_a_channel_or_mint_for_a_user(acme, globex, api_for):
    fleet = acme.channels["fleet"]
    intruder = api_for(globex)
    assert intruder.call("PUT", f"/v1/channels/{fleet.id}/members/zed").status_code == 404
    assert intruder.call("DELETE", f"/v1/channels/{fleet.id}/members/linh").status_code == 404
    assert intruder.call("POST", "/v1/tokens", {"user": "tuan"}).status_code == 404
    # globex's own linh is theirs: a token for it names globex, never acme.
    token = intruder.call("POST", "/v1/tokens", {"user": "linh"}).json()["token"]
    assert verify_token(token).environment_id == globex.environment.id
    assert Membership.objects.filter(channel=fleet).count() == 2
    assert api_for(acme).call("DELETE", f"/v1/channels/{fleet.id}/members/linh").status_code == 204


def test_a_tenant_cannot_add_another_tenants_user_to_its_channel(acme, globex, api_for):
    board = globex.channels["board"]
    assert api_for(globex).call("PUT", f"/v1/channels/{board.id}/members/linh").status_code == 200
    assert api_for(globex).call("PUT", f"/v1/channels/{board.id}/members/tuan").status_code == 404


# ── health ───────────────────────────────────────────────────────────────────
def test_healthz_and_readyz_answer_without_a_key(api_for):
    assert api_for(None).call("GET", "/healthz").status_code == 200
    ready = api_for(None).call("GET", "/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "redis": "ok"}


def test_readyz_is_503_when_redis_does_not_answer(api_for, settings):
    settings.RELAY_REDIS_URL = "redis://127.0.0.1:1/0"
    ready = api_for(None).call("GET", "/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"] == "ok"
    assert ready.json()["checks"]["redis"] != "ok"
