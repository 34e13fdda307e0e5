"""The demo web client: the page, its static files and the dev-only sign-in.

Who is who: `setupdemo` creates the `local` environment with linh, tuan, mai and an;
linh is in "fleet" (linh, tuan) and "general" (everyone), not in "ops" (mai, an).
"""

import json
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from relay.asgi import application
from relay.models import Environment, User
from relay.tokens import verify_token


@pytest.fixture
def local(db: None) -> Environment:
    """The environment `make run` creates on first start."""
    call_command("setupdemo", stdout=StringIO())
    return Environment.objects.get(name="local")


@pytest.fixture
def demo_on(settings) -> None:
    settings.DEBUG = False
    settings.RELAY_DEMO = True


def sign_in(user: object) -> object:
    return Client().post("/demo/session", data=json.dumps({"user": user}), content_type="application/json")


# ── the page ─────────────────────────────────────────────────────────────────
def test_the_page_lists_the_local_users_to_sign_in_as_when_the_demo_is_on(local, demo_on):
    response = Client().get("/")
    assert response.status_code == 200
    page = response.content.decode()
    for name in ("Linh", "Tuan", "Mai", "An"):
        assert f">{name}</button>" in page
    assert "/static/web/client.js" in page


def test_the_page_escapes_user_names(local, demo_on):
    User.objects.filter(environment=local, external_id="an").update(name="<script>alert(1)</script>")
    page = Client().get("/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page


def test_the_page_forbids_inline_script_and_other_origins(local, demo_on):
    policy = Client().get("/")["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy


def test_the_page_says_the_demo_is_off_and_lists_nobody_when_it_is_off(local, settings):
    settings.DEBUG = False
    settings.RELAY_DEMO = False
    response = Client().get("/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "The demo sign-in is off" in page
    assert ">Linh</button>" not in page


def test_the_page_tells_how_to_create_the_local_environment_when_it_is_missing(db, demo_on):
    page = Client().get("/").content.decode()
    assert "manage.py setupdemo" in page


async def get_start(path: str) -> tuple[int, dict[str, str]]:
    """GET `path` from the ASGI application; return the status and headers it starts with."""
    communicator = HttpCommunicator(application, "GET", path)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=5)
    await communicator.wait(timeout=5)
    return start["status"], {name.decode().lower(): value.decode() for name, value in start["headers"]}


async def test_static_files_are_served_by_the_asgi_application_itself():
    # Daphne serves no files: without the static handler admin has no CSS and the client no JS.
    for path, kind in (("/static/web/client.js", "javascript"), ("/static/admin/css/base.css", "text/css")):
        status, headers = await get_start(path)
        assert status == 200, path
        assert kind in headers["content-type"]
    assert (await get_start("/static/web/nothing.js"))[0] == 404


# ── the sign-in ──────────────────────────────────────────────────────────────
@pytest.mark.parametrize(("debug", "demo"), [(True, False), (False, True)])
def test_the_sign_in_is_on_with_debug_or_relay_demo(local, settings, debug, demo):
    settings.DEBUG = debug
    settings.RELAY_DEMO = demo
    response = sign_in("linh")
    assert response.status_code == 200
    body = response.json()
    assert body["user"] == {"id": "linh", "name": "Linh"}
    user = verify_token(body["token"])
    assert (user.environment_id, user.external_id) == (local.id, "linh")


def test_the_sign_in_is_404_when_neither_debug_nor_relay_demo_is_set(local, settings):
    settings.DEBUG = False
    settings.RELAY_DEMO = False
    response = sign_in("linh")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert "token" not in response.json()
    settings.RELAY_DEMO = True
    assert sign_in("linh").status_code == 200


def test_the_sign_in_returns_the_users_channels_with_their_members(local, demo_on):
    channels = sign_in("linh").json()["channels"]
    assert [(channel["name"], channel["type"]) for channel in channels] == [("fleet", "private"), ("general", "public")]
    fleet, general = channels
    assert fleet["id"] == str(local.channels.get(name="fleet").id)
    assert fleet["members"] == [{"id": "linh", "name": "Linh"}, {"id": "tuan", "name": "Tuan"}]
    assert [member["id"] for member in general["members"]] == ["an", "linh", "mai", "tuan"]


def test_the_sign_in_counts_a_large_channel_instead_of_listing_its_members(local, demo_on):
    local.large_room_members = 3
    local.save(update_fields=["large_room_members"])
    fleet, general = sign_in("linh").json()["channels"]
    # general has four members, more than 3: counted; fleet has two: listed.
    assert (general["large"], general["member_count"], general["members"]) == (True, 4, [])
    assert (fleet["large"], fleet["member_count"]) == (False, 2)
    assert [member["id"] for member in fleet["members"]] == ["linh", "tuan"]


def test_the_sign_in_reads_no_member_of_a_large_channel(local, demo_on):
    def user_reads() -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            assert sign_in("linh").status_code == 200
        return [query["sql"] for query in queries if 'FROM "relay_user"' in query["sql"]]

    # Small channels: the signed-in user, then one read of all their channels' members.
    assert len(user_reads()) == 2
    local.large_room_members = 1
    local.save(update_fields=["large_room_members"])
    # Both channels large: only the signed-in user is read.
    assert len(user_reads()) == 1


def test_an_unknown_user_is_404_and_gets_no_token(local, demo_on):
    response = sign_in("nobody")
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "user_not_found", "message": "no such user"}}
    assert sign_in("mai").status_code == 200


def test_a_user_of_another_environment_is_404(local, demo_on, acme):
    assert sign_in("hermit").status_code == 404
    assert sign_in("linh").json()["user"]["id"] == "linh"


@pytest.mark.parametrize("body", [{}, {"user": ""}, {"user": 7}, {"user": "linh", "extra": 1}, None])
def test_a_bad_body_is_400(local, demo_on, body):
    response = Client().post("/demo/session", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] in {"invalid_body", "invalid_json"}
    assert sign_in("linh").status_code == 200


def test_the_sign_in_is_post_only(local, demo_on):
    assert Client().get("/demo/session").status_code == 405
    assert sign_in("linh").status_code == 200


def test_the_sign_in_without_the_local_environment_is_404(db, demo_on):
    response = sign_in("linh")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "environment_not_found"


@pytest.mark.django_db(transaction=True)
async def test_the_minted_token_opens_a_websocket_as_that_user(demo_on):
    await sync_to_async(call_command)("setupdemo", stdout=StringIO())
    body = (await sync_to_async(sign_in)("tuan")).json()
    communicator = WebsocketCommunicator(application, f"/v1/ws?token={body['token']}")
    connected, _ = await communicator.connect()
    assert connected
    ack = json.loads(await communicator.receive_from(timeout=3))
    assert ack["type"] == "connection.ack"
    assert ack["payload"]["user"] == "tuan"
    assert sorted(ack["payload"]["channels"]) == sorted(channel["id"] for channel in body["channels"])
    await communicator.disconnect()
