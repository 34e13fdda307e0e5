"""Webhook endpoints over the API, the outbox rows each database change writes, and the signatures.

The live half (real instances, a real receiver) is tests/test_webhooks_live.py.
"""

import json
import socket
import time
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from agents import actions as agent_actions
from agents.models import Registration
from chat.actions import send_message
from presence.models import UserStatus
from presence.queries import mark_last_seen
from presence.status import claim_expired, write_status
from relay.frames import Capability, PresenceSet
from relay.models import Environment, Membership
from webhooks import events
from webhooks.addresses import PublicResolver, RefusedAddress, RefusedUrl, check_url
from webhooks.models import Delivery, Endpoint
from webhooks.signing import signed_headers

pytestmark = pytest.mark.django_db

RECEIVER = "http://127.0.0.1:9/hooks"


def error_code(response) -> str:
    return response.json()["error"]["code"]


def create(api, url: str = RECEIVER, kinds: list[str] | None = None):
    return api.call("POST", "/v1/webhooks", {"url": url, "events": kinds or ["*"]})


# ── endpoints ────────────────────────────────────────────────────────────────
def test_an_endpoint_is_created_with_its_secret_shown_once_and_listed_without_it(acme, api_for):
    api = api_for(acme)
    created = create(api, kinds=["user.online", "user.offline"])
    assert created.status_code == 201
    body = created.json()
    assert set(body) == {"id", "url", "events", "secret"}
    assert body["secret"].startswith("whsec_") and len(Webhook(body["secret"])._whsecret) == 32
    listed = api.call("GET", "/v1/webhooks").json()
    assert listed == {"webhooks": [{"id": body["id"], "url": RECEIVER, "events": ["user.online", "user.offline"]}]}
    assert body["secret"] not in json.dumps(listed)


def test_deleting_is_204_and_another_tenants_endpoint_is_404(acme, globex, api_for):
    mine = create(api_for(acme)).json()["id"]
    theirs = create(api_for(globex)).json()["id"]
    assert api_for(acme).call("DELETE", f"/v1/webhooks/{theirs}").status_code == 404
    assert api_for(acme).call("DELETE", "/v1/webhooks/not-a-uuid").status_code == 404
    assert Endpoint.objects.filter(id=theirs).exists()
    assert api_for(acme).call("DELETE", f"/v1/webhooks/{mine}").status_code == 204
    assert not Endpoint.objects.filter(id=mine).exists()
    assert [w["id"] for w in api_for(globex).call("GET", "/v1/webhooks").json()["webhooks"]] == [theirs]


@pytest.mark.parametrize(
    "body",
    [
        {"url": "ftp://example.com/x", "events": ["*"]},
        {"url": "http://", "events": ["*"]},
        {"url": "http://user:pw@example.com/", "events": ["*"]},
        {"url": RECEIVER, "events": []},
        {"url": RECEIVER, "events": ["user.teleported"]},
        {"url": RECEIVER, "events": "*"},
        {"url": RECEIVER},
        {"url": RECEIVER, "events": ["*"], "secret": "mine"},
        {"url": "x" * 3000, "events": ["*"]},
    ],
)
def test_a_bad_body_is_400_and_creates_nothing(acme, api_for, body):
    response = api_for(acme).call("POST", "/v1/webhooks", body)
    assert response.status_code == 400
    assert error_code(response) in ("invalid_body", "invalid_request")
    assert not Endpoint.objects.exists()
    assert create(api_for(acme)).status_code == 201


def test_no_key_is_401(api_for, acme):
    assert api_for(None).call("GET", "/v1/webhooks").status_code == 401
    assert api_for(acme).call("GET", "/v1/webhooks").status_code == 200


@override_settings(RELAY_WEBHOOK_ALLOW_PRIVATE=False)
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/h",
        "http://localhost/h",
        "http://10.1.2.3/h",
        "http://169.254.169.254/latest",
        "http://[::1]/h",
        "http://[::ffff:127.0.0.1]/h",
        "https://192.168.0.4/h",
        "http://0.0.0.0/h",
    ],
)
def test_a_loopback_private_or_link_local_host_is_refused(acme, api_for, url):
    response = create(api_for(acme), url=url)
    assert (response.status_code, error_code(response)) == (400, "invalid_request")
    assert not Endpoint.objects.exists()
    # A public address is accepted under the same settings (an address: no DNS needed).
    assert create(api_for(acme), url="https://93.184.215.14/hooks").status_code == 201


def test_private_hosts_are_accepted_when_allowed(acme, api_for, settings):
    settings.RELAY_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(RefusedUrl):
        check_url(RECEIVER)
    settings.RELAY_WEBHOOK_ALLOW_PRIVATE = True
    check_url(RECEIVER)
    assert create(api_for(acme)).status_code == 201


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "169.254.169.254", "10.1.2.3"])
async def test_the_delivery_resolver_refuses_what_the_address_rule_refuses(host, settings):
    # aiohttp's own resolver underneath: `localhost` is a name the machine answers with loopback.
    resolver = PublicResolver()
    settings.RELAY_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(RefusedAddress):
        await resolver.resolve(host, 443, socket.AF_UNSPEC)
    assert [a["host"] for a in await resolver.resolve("93.184.215.14", 443)] == ["93.184.215.14"]
    settings.RELAY_WEBHOOK_ALLOW_PRIVATE = True
    assert await resolver.resolve(host, 443, socket.AF_UNSPEC)


def test_the_endpoints_are_in_the_openapi_document(api_for):
    paths = api_for(None).call("GET", "/v1/openapi.json").json()["paths"]
    assert set(paths["/v1/webhooks"]) >= {"get", "post"}
    assert "delete" in paths["/v1/webhooks/{webhook_id}"]


# ── the outbox ───────────────────────────────────────────────────────────────
def bodies(kind: str) -> list[dict]:
    return [json.loads(row.body) for row in Delivery.objects.filter(event_type=kind).order_by("id")]


def test_member_changes_write_their_events_in_their_own_transaction(acme, globex, api_for):
    create(api_for(acme), kinds=["member.added", "member.removed"])
    other = create(api_for(globex)).json()["id"]
    channel = acme.channels["general"]
    assert api_for(acme).call("PUT", f"/v1/channels/{channel.id}/members/hermit").status_code == 201
    assert api_for(acme).call("DELETE", f"/v1/channels/{channel.id}/members/hermit").status_code == 204
    added, removed = bodies("member.added"), bodies("member.removed")
    assert [b["data"] for b in added] == [{"channel": str(channel.id), "user": "hermit"}]
    assert [b["data"] for b in removed] == [{"channel": str(channel.id), "user": "hermit"}]
    assert added[0]["type"] == "member.added"
    assert datetime.fromisoformat(added[0]["timestamp"]).tzinfo is not None
    # A change rolled back leaves no event; another tenant's endpoint hears nothing of acme's.
    with pytest.raises(RuntimeError), transaction.atomic():
        Membership.objects.create(channel=channel, user=acme.users["hermit"])
        raise RuntimeError("rolled back")
    assert len(bodies("member.added")) == 1
    assert not Delivery.objects.filter(endpoint_id=other).exists()


BUSY = {"status": "busy", "text": "in a meeting", "emoji": ":calendar:"}


def status_set(acme, user_id: str, **fields: object) -> None:
    write_status(str(acme.environment.id), acme.users[user_id], PresenceSet.model_validate(fields), channels=[])


def test_every_status_change_writes_one_user_status_event_and_nothing_else_does(acme, api_for):
    create(api_for(acme), kinds=["user.status"])
    Environment.objects.filter(pk=acme.environment.pk).update(allow_invisible=True)
    status_set(acme, "tuan", **BUSY, until="2099-01-01T00:00:00Z")
    assert [b["data"] for b in bodies("user.status")] == [
        {"user": "tuan", **BUSY, "until": "2099-01-01T00:00:00.000Z", "invisible": False}
    ]
    # The same set again, a last-seen and a rolled-back change send nothing.
    status_set(acme, "tuan", **BUSY)
    mark_last_seen([(str(acme.environment.id), "tuan")], time.time())
    with pytest.raises(RuntimeError), transaction.atomic():
        status_set(acme, "tuan", status="away")
        raise RuntimeError("rolled back")
    assert len(bodies("user.status")) == 1
    status_set(acme, "tuan", invisible=True)
    assert bodies("user.status")[1]["data"] == {"user": "tuan", **BUSY, "until": "2099-01-01T00:00:00.000Z"} | {
        "invisible": True
    }
    # An expiry is claimed, and sent, once however many sweeps run.
    UserStatus.objects.filter(user=acme.users["tuan"]).update(until=timezone.now() - timedelta(seconds=1))
    assert [user.external_id for _, user, _ in claim_expired(timezone.now())] == ["tuan"]
    assert claim_expired(timezone.now()) == []
    assert [b["data"] for b in bodies("user.status")][2:] == [
        {"user": "tuan", "status": "available", "text": "", "emoji": "", "until": None, "invisible": True}
    ]
    assert Delivery.objects.count() == 3


def test_an_endpoint_gets_only_the_events_it_subscribed_to(acme, api_for):
    create(api_for(acme), kinds=["message.created"])
    channel = acme.channels["general"]
    Membership.objects.filter(channel=channel, user=acme.users["tuan"]).delete()
    sent = send_message(acme.users["linh"], str(channel.id), "k1", "hello")
    assert [b["data"] for b in bodies("message.created")] == [sent.message]
    assert Delivery.objects.count() == 1
    # The same idem_key again stores nothing and so sends nothing.
    send_message(acme.users["linh"], str(channel.id), "k1", "hello")
    assert Delivery.objects.count() == 1


def test_agents_registered_deregistered_and_swept(acme, api_for, agents_clock):
    create(api_for(acme), kinds=["agent.registered", "agent.removed"])
    linh = acme.users["linh"]
    agent_actions.do_register(linh, "w-1", Capability(cognition="gpt", weight=2.0), "c1")
    agent_actions.do_register(linh, "w-1", Capability(cognition="gpt"), "c2")  # a refresh: no event
    agent_actions.do_register(linh, "w-2", Capability(), "c3")
    assert [b["data"] for b in bodies("agent.registered")] == [
        {"instance": "w-1", "identity": "linh", "capability": {"cognition": "gpt", "weight": 2.0}},
        {"instance": "w-2", "identity": "linh", "capability": {}},
    ]
    assert agent_actions.do_deregister(linh, "w-1")
    agents_clock.advance(milliseconds=60_000)
    assert agent_actions.sweep_stale() == [(str(acme.environment.id), "w-2")]
    assert not Registration.objects.exists()
    assert [b["data"] for b in bodies("agent.removed")] == [
        {"instance": "w-1", "reason": "deregistered"},
        {"instance": "w-2", "reason": "swept"},
    ]


def test_one_event_has_one_webhook_id_for_every_endpoint(acme, api_for):
    create(api_for(acme))
    create(api_for(acme), url="http://127.0.0.1:10/other")
    Membership.objects.create(channel=acme.channels["general"], user=acme.users["hermit"])
    rows = Delivery.objects.filter(event_type="member.added")
    assert rows.count() == 2
    assert len({row.webhook_id for row in rows}) == 1 and rows[0].webhook_id.startswith("msg_")


def test_the_in_process_signal_follows_the_commit(acme, django_capture_on_commit_callbacks):
    heard = []

    def listen(sender, **kwargs):
        heard.append((sender, kwargs["data"]))

    events.event.connect(listen)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            Membership.objects.create(channel=acme.channels["general"], user=acme.users["hermit"])
    finally:
        events.event.disconnect(listen)
    assert heard == [("member.added", {"channel": str(acme.channels["general"].id), "user": "hermit"})]


# ── signatures ───────────────────────────────────────────────────────────────
def test_the_signature_verifies_with_standardwebhooks_and_fails_when_tampered():
    secret = Endpoint().secret
    body = events.envelope("user.online", "2026-12-05T10:00:00.000+00:00", {"user": "linh"})
    headers = signed_headers(secret, "msg_1", body)
    assert Webhook(secret).verify(body, headers) == json.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace("linh", "tuan"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(Endpoint().secret).verify(body, headers)


# ── admin ────────────────────────────────────────────────────────────────────
def test_admin_shows_the_delivery_log_and_never_the_secret(acme, api_for, staff):
    created = create(api_for(acme), kinds=["member.added"]).json()
    Membership.objects.create(channel=acme.channels["general"], user=acme.users["hermit"])
    Delivery.objects.update(attempts=2, last_status_code=503, last_error="HTTP 503", last_latency_ms=12)
    log = staff.get(reverse("admin:webhooks_delivery_changelist")).content.decode()
    assert "member.added" in log and "HTTP 503" in log and "pending" in log
    page = staff.get(reverse("admin:webhooks_endpoint_change", args=[created["id"]])).content.decode()
    assert RECEIVER in page
    assert created["secret"] not in page and created["secret"] not in log
