"""The staff overview: a Presence page per environment and counts on the admin index."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.models import Registration
from devtools.embedded_redis import free_port
from presence.models import UserStatus
from presence.scripts import connections_key, marker_key, presence_key
from presence.status import devices_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def online(acme, globex, redis_client):
    """linh online in acme (with the other keys presence keeps beside hers), zed in globex."""
    env = str(acme.environment.id)
    redis_client.set(presence_key(env, "linh"), "1", px=60_000)
    redis_client.set(marker_key(env, "tuan"), "1", px=60_000)
    redis_client.zadd(connections_key(env, "linh"), {"c1": 1})
    redis_client.set(presence_key(str(globex.environment.id), "zed"), "1", px=60_000)


@pytest.fixture
def agents(acme):
    now = timezone.now()
    for instance, seen in (("w-alive", now), ("w-stale", now - timedelta(hours=1))):
        Registration.objects.create(
            environment=acme.environment,
            instance=instance,
            identity=acme.users["linh"],
            connection_id="c",
            family="gpu",
            registered_at=now - timedelta(hours=2),
            last_seen=seen,
        )


def presence_url(tenant) -> str:
    return reverse("overview_environment_presence", args=[tenant.environment.pk])


def test_the_presence_page_lists_who_is_online_and_the_agents_alive_state(staff, acme, online, agents):
    page = staff.get(presence_url(acme)).content.decode()
    assert "Online now: 1" in page
    assert ">linh</a>" in page
    # tuan only has an offline marker, and globex's zed is another tenant's.
    assert ">tuan</a>" not in page and "zed" not in page
    assert "Agent registrations: 1 alive of 2" in page
    assert 'class="alive"' in page and "w-alive" in page
    assert 'class="stale"' in page and "w-stale" in page
    assert "family=gpu" in page


def test_the_admin_index_shows_each_environments_counts(staff, acme, globex, online, agents):
    page = staff.get("/admin/").content.decode()
    assert 'id="relay-overview"' in page
    acme_row = page[page.index(">acme</a>") :].split("</tr>")[0]
    assert '<td class="online-count">1</td>' in acme_row
    assert '<td class="agents-count">1 of 2</td>' in acme_row
    globex_row = page[page.index(">globex</a>") :].split("</tr>")[0]
    assert '<td class="agents-count">0 of 0</td>' in globex_row
    # The environment list links each tenant to its page.
    assert presence_url(acme) in staff.get("/admin/relay/environment/").content.decode()


def test_the_pages_refuse_anyone_but_staff(acme, client):
    assert client.get(presence_url(acme)).status_code == 302
    member = Client()
    member.force_login(get_user_model().objects.create_user("member", password="x"))
    response = member.get(presence_url(acme))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert member.get("/admin/").status_code == 302


def test_an_unknown_environment_is_404(staff, acme):
    assert staff.get(presence_url(acme)).status_code == 200
    assert staff.get("/admin/environments/6f1c1c7e-4d55-4a3c-9a3f-3f0b0f4c8a11/presence/").status_code == 404


def test_with_the_presence_store_down_the_pages_still_render_and_say_so(staff, acme, agents, settings):
    settings.RELAY_PRESENCE_REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    page = staff.get(presence_url(acme)).content.decode()
    assert "The presence store does not answer" in page
    assert "Agent registrations: 1 alive of 2" in page
    index = staff.get("/admin/").content.decode()
    assert 'title="presence store unavailable">?</span>' in index


def test_the_presence_page_shows_each_online_users_status_and_devices(staff, acme, online, redis_client):
    UserStatus.objects.create(user=acme.users["linh"], status="busy", text="in a meeting", invisible=True)
    far = 10**13  # Redis ms: counts until long after the test
    redis_client.hset(
        devices_key(str(acme.environment.id), "linh"),
        mapping={"c1": f"mobile|1|1000|{far}", "c2": f"web|0|2000|{far}", "c3": "desktop|0|1|1"},
    )
    page = staff.get(presence_url(acme)).content.decode()
    assert "busy — in a meeting" in page and "invisible" in page
    assert "mobile (idle), web" in page
    assert "desktop" not in page  # its entry stopped counting long ago
