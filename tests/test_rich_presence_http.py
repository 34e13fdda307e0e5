"""/v1/settings and the admin of user statuses (docs/contract.md, Rich presence)."""

import pytest

from presence.models import UserStatus
from presence.status import Status, status_key

pytestmark = pytest.mark.django_db

DEFAULTS = {"allow_invisible": True, "share_last_seen": True, "large_room_members": 1000, "signal_max_members": 100}


def test_settings_are_read_and_patched_in_any_subset(acme, globex, api_for):
    api = api_for(acme)
    assert api.call("GET", "/v1/settings").json() == DEFAULTS
    response = api.call("PATCH", "/v1/settings", {"share_last_seen": False, "large_room_members": 50})
    assert response.status_code == 200
    assert response.json() == DEFAULTS | {"share_last_seen": False, "large_room_members": 50}
    assert api.call("PATCH", "/v1/settings", {}).json() == response.json()
    acme.environment.refresh_from_db()
    assert acme.environment.large_room_members == 50
    # Another tenant's settings are their own.
    assert api_for(globex).call("GET", "/v1/settings").json() == DEFAULTS


@pytest.mark.parametrize(
    "body",
    [
        {"allow_invisible": "yes"},
        {"allow_invisible": None},
        {"share_last_seen": 1},
        {"large_room_members": 0},
        {"large_room_members": -5},
        {"large_room_members": 1.5},
        {"signal_max_members": "100"},
        {"signal_max_members": 10**12},
        {"colour": "red"},
        ["allow_invisible"],
    ],
)
def test_bad_settings_are_400_invalid_request_and_change_nothing(acme, api_for, body):
    response = api_for(acme).call("PATCH", "/v1/settings", body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] in ("invalid_request",)
    assert api_for(acme).call("GET", "/v1/settings").json() == DEFAULTS


def test_settings_need_the_key_and_only_get_and_patch(acme, api_for):
    assert api_for(None).call("GET", "/v1/settings").status_code == 401
    assert api_for(acme).call("POST", "/v1/settings", {}).status_code == 405
    assert api_for(acme).call("GET", "/v1/settings").status_code == 200


def test_settings_are_in_the_openapi_document(api_for, acme):
    paths = api_for(None).call("GET", "/v1/openapi.json").json()["paths"]
    assert {"get", "patch"} <= set(paths["/v1/settings"])
    assert "put" in paths["/v1/users/{user_id}/status"]
    assert "get" in paths["/v1/users/{user_id}/presence"]


# Transactional: a save in admin stores the status in a thread of its own (as the API does).
@pytest.mark.django_db(transaction=True)
def test_admin_lists_and_edits_statuses_of_the_staffs_environments(acme, globex, staff, redis_client):
    UserStatus.objects.create(user=acme.users["tuan"], status="busy", text="in a meeting")
    UserStatus.objects.create(user=globex.users["zed"], status="away")
    page = staff.get("/admin/presence/userstatus/")
    assert page.status_code == 200
    assert b"in a meeting" in page.content and b"globex" in page.content
    key = status_key(str(acme.environment.id), "tuan")
    redis_client.hset(key, mapping=Status("busy", "in a meeting").cache_fields())
    row = UserStatus.objects.get(user=acme.users["tuan"])
    response = staff.post(
        f"/admin/presence/userstatus/{row.pk}/change/",
        {"status": "dnd", "text": "focus", "emoji": "", "until_0": "", "until_1": "", "invisible": ""},
    )
    assert response.status_code == 302, response.content[:2000]
    row.refresh_from_db()
    assert (row.status, row.text) == ("dnd", "focus")
    # Stored as `PUT .../status` stores it: the Redis copy is the new status.
    assert (redis_client.hget(key, "s"), redis_client.hget(key, "t")) == ("dnd", "focus")


ADMIN_FORM = {"status": "busy", "text": "in a meeting", "emoji": "", "until_0": "", "until_1": ""}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"text": "x" * 141}, "text"),
        ({"emoji": "x" * 33}, "emoji"),
        ({"text": "bell\u0007"}, "text"),
        ({"status": "sleeping"}, "status"),
        ({"until_0": "2001-01-01", "until_1": "00:00:00"}, "until"),
        ({"invisible": "on"}, "invisible"),
    ],
)
def test_admin_refuses_what_presence_set_refuses_and_changes_nothing(acme, staff, redis_client, change, field):
    acme.environment.allow_invisible = False
    acme.environment.save(update_fields=["allow_invisible"])
    row = UserStatus.objects.create(user=acme.users["tuan"], status="busy", text="in a meeting")
    response = staff.post(f"/admin/presence/userstatus/{row.pk}/change/", ADMIN_FORM | change)
    assert response.status_code == 200  # the form again, with the error
    assert field in response.context["adminform"].form.errors
    row.refresh_from_db()
    assert (row.status, row.text, row.emoji, row.until, row.invisible) == ("busy", "in a meeting", "", None, False)
    assert redis_client.hget(status_key(str(acme.environment.id), "tuan"), "s") is None
    # The same form with an allowed change is taken.
    response = staff.post(f"/admin/presence/userstatus/{row.pk}/change/", ADMIN_FORM | {"text": "back at 3"})
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.text == "back at 3"


def test_a_users_presence_and_status_are_404_for_another_tenants_or_unknown_user(acme, globex, api_for):
    api = api_for(acme)
    found = api.call("GET", "/v1/users/tuan/presence")
    assert found.status_code == 200
    assert found.json() == {
        "user": "tuan",
        "state": "offline",
        "status": "available",
        "text": "",
        "emoji": "",
        "until": None,
        "idle": False,
        "invisible": False,
        "last_seen_at": None,
        "connections": [],
    }
    for path in ("/v1/users/zed/presence", "/v1/users/nobody/presence"):
        assert api.call("GET", path).status_code == 404
    assert api.call("PUT", "/v1/users/zed/status", {"status": "busy"}).status_code == 404
    assert not UserStatus.objects.exists()
    assert api_for(None).call("GET", "/v1/users/tuan/presence").status_code == 401
