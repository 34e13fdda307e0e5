"""The environment admin's actions run only for staff whose permissions cover them.

Vic is staff granted acme with only the view permissions; Cam is staff granted acme who may
change environments and add API keys. Both are sent the same action POSTs.
"""

import pytest
from django.contrib.auth.models import Permission
from django.contrib.auth.models import User as StaffUser
from django.test import Client
from django.urls import reverse

from relay.models import ApiKey, Environment

pytestmark = pytest.mark.django_db


def staff_member(name: str, tenant, codenames: list[str]) -> Client:
    user = StaffUser.objects.create_user(name, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="relay", codename__in=codenames))
    tenant.environment.staff.add(user)
    client = Client()
    client.force_login(user)
    return client


VIEW_ONLY = ["view_environment", "view_apikey", "view_user", "view_channel", "view_membership"]


@pytest.fixture
def vic(acme) -> Client:
    return staff_member("vic", acme, VIEW_ONLY)


@pytest.fixture
def cam(acme) -> Client:
    return staff_member("cam", acme, [*VIEW_ONLY, "change_environment", "add_apikey"])


def run_action(client: Client, action: str, environment: Environment):
    url = reverse("admin:relay_environment_changelist")
    return client.post(url, {"action": action, "_selected_action": [str(environment.pk)]})


@pytest.mark.parametrize("action", ["rotate_signing_secret", "issue_api_key"])
def test_a_view_only_staff_member_is_refused_each_action_and_nothing_changes(vic, cam, acme, action):
    environment = acme.environment
    secret, keys = environment.signing_secret, ApiKey.objects.filter(environment=environment).count()
    # Vic can see the list, without the actions.
    page = vic.get(reverse("admin:relay_environment_changelist"))
    assert page.status_code == 200 and "acme" in page.content.decode()
    assert action not in page.content.decode()
    assert run_action(vic, action, environment).status_code == 403
    environment.refresh_from_db()
    assert (environment.signing_secret, ApiKey.objects.filter(environment=environment).count()) == (secret, keys)
    # Cam, who holds the permissions, runs the same POST.
    assert run_action(cam, action, environment).status_code == 302
    environment.refresh_from_db()
    changed = (environment.signing_secret != secret, ApiKey.objects.filter(environment=environment).count() > keys)
    assert changed == ((True, False) if action == "rotate_signing_secret" else (False, True))
