"""Staff see only their tenants in admin; superusers see everything.

Sam is staff with every permission on tenants' data but is granted only acme; "staff" (the
conftest's) is a superuser. Each page shows acme's marker and, for Sam, never globex's.
"""

import pytest
from django.contrib.auth.models import Permission
from django.contrib.auth.models import User as StaffUser
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.actions import do_register
from chat.actions import send_message
from relay.frames import Capability
from relay.models import Environment, User
from webhooks.models import Endpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(acme, globex) -> dict:
    """Each tenant with an agent registration and a message, each marked with its tenant's name."""
    now = timezone.now()
    Endpoint.objects.create(environment=acme.environment, url="http://acme.example/hooks", events=["*"])
    Endpoint.objects.create(environment=globex.environment, url="http://globex.example/hooks", events=["*"])
    do_register(acme.users["linh"], "w-acme", Capability(), "c1", now)
    do_register(globex.users["zed"], "w-globex", Capability(), "c2", now)
    send_message(acme.users["linh"], str(acme.channels["fleet"].id), "k1", "said-in-acme")
    send_message(globex.users["zed"], str(globex.channels["board"].id), "k2", "said-in-globex")
    return {"acme": acme, "globex": globex}


@pytest.fixture
def sam(world) -> Client:
    """Staff, not a superuser, with every permission on Relay's models, granted acme only."""
    user = StaffUser.objects.create_user("sam", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label__in=["relay", "agents", "chat", "webhooks"])
    )
    world["acme"].environment.staff.add(user)
    client = Client()
    client.force_login(user)
    return client


PAGES = {
    "admin:relay_user_changelist": ("hermit", "zed"),
    "admin:relay_channel_changelist": ("fleet", "board"),
    "admin:relay_membership_changelist": ("in fleet", "in board"),
    "admin:relay_apikey_changelist": ("(acme)", "(globex)"),
    "admin:relay_environment_changelist": ("acme", "globex"),
    "admin:agents_registration_changelist": ("w-acme", "w-globex"),
    "admin:chat_message_changelist": ("said-in-acme", "said-in-globex"),
    "admin:webhooks_endpoint_changelist": ("acme.example", "globex.example"),
    "admin:webhooks_delivery_changelist": ("acme.example", "globex.example"),
    "admin:index": (">acme<", ">globex<"),
}


@pytest.mark.parametrize("page", PAGES)
def test_staff_see_only_their_environments_and_superusers_all(page, sam, staff):
    mine, theirs = PAGES[page]
    for_sam = sam.get(reverse(page))
    assert for_sam.status_code == 200
    assert mine in for_sam.content.decode()
    assert theirs not in for_sam.content.decode()
    for_superuser = staff.get(reverse(page)).content.decode()
    assert mine in for_superuser and theirs in for_superuser


def test_another_tenants_objects_and_presence_page_are_not_found(sam, world):
    acme, globex = world["acme"], world["globex"]
    presence = "overview_environment_presence"
    assert sam.get(reverse(presence, args=[acme.environment.id])).status_code == 200
    assert sam.get(reverse(presence, args=[globex.environment.id])).status_code == 404
    assert sam.get(reverse("admin:relay_user_change", args=[acme.users["linh"].pk])).status_code == 200
    # Django answers an object outside the queryset with a redirect to the index: it does not exist.
    assert sam.get(reverse("admin:relay_user_change", args=[globex.users["zed"].pk])).status_code == 302


def test_forms_offer_only_the_staffs_environments(sam):
    form = sam.get(reverse("admin:relay_channel_add")).content.decode()
    assert ">acme<" in form
    assert ">globex<" not in form


def test_an_objects_environment_is_read_only_once_it_exists(sam, world):
    acme, globex = world["acme"], world["globex"]
    hermit = acme.users["hermit"]
    url = reverse("admin:relay_user_change", args=[hermit.pk])
    assert 'name="environment"' not in sam.get(url).content.decode()
    assert 'name="environment"' in sam.get(reverse("admin:relay_user_add")).content.decode()
    form = {"external_id": "hermit", "name": "Renamed", "environment": globex.environment.pk}
    # Hermit has no memberships: the inline's management form says so.
    form |= {"memberships-TOTAL_FORMS": 0, "memberships-INITIAL_FORMS": 0}
    response = sam.post(url, form)
    assert response.status_code == 302
    hermit = User.objects.get(pk=hermit.pk)
    assert (hermit.name, hermit.environment_id) == ("Renamed", acme.environment.id)


def test_only_superusers_grant_environments(sam, staff, world):
    acme = world["acme"].environment
    url = reverse("admin:relay_environment_change", args=[acme.pk])
    assert 'name="staff"' in staff.get(url).content.decode()
    assert 'name="staff"' not in sam.get(url).content.decode()
    assert sam.get(reverse("admin:relay_environment_add")).status_code == 403
    assert Environment.objects.filter(staff__username="sam").count() == 1
