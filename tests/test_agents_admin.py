"""Django admin for the agent registry: staff see and filter rows and remove them; nobody edits them."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User as StaffUser
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.actions import do_register
from agents.models import Registration
from relay.frames import Capability

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:agents_registration_changelist")


@pytest.fixture
def fleet(acme, globex) -> dict[str, Registration]:
    """acme's linh runs a live planner and a stale coder; globex's zed runs one live worker."""
    now = timezone.now()
    rows = {
        "planner-1": do_register(
            acme.users["linh"], "planner-1", Capability(cognition="planner", family="gpt", host="box-a"), "c1", now
        )[0],
        "coder-1": do_register(
            acme.users["linh"],
            "coder-1",
            Capability(cognition="coder", family="claude", host="box-b"),
            "c1",
            now - timedelta(minutes=5),
        )[0],
        "zed-1": do_register(globex.users["zed"], "zed-1", Capability(weight=2.5), "c2", now)[0],
    }
    return rows


def listed(response) -> set[str]:
    return {row.instance for row in response.context["cl"].result_list}


def test_the_changelist_shows_every_row_with_its_columns(staff, fleet):
    response = staff.get(CHANGELIST)
    assert response.status_code == 200
    assert listed(response) == {"planner-1", "coder-1", "zed-1"}
    page = response.content.decode()
    for header in (
        "Instance",
        "Identity",
        "Cognition",
        "Weight",
        "Family",
        "Host",
        "Registered at",
        "Last seen",
        "Alive",
    ):
        assert header in page
    # The alive column: the stale coder is shown dead, the others alive.
    assert page.count('alt="True"') == 2
    assert page.count('alt="False"') == 1


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("alive=yes", {"planner-1", "zed-1"}),
        ("alive=no", {"coder-1"}),
        ("family=gpt", {"planner-1"}),
        ("cognition=coder", {"coder-1"}),
        ("host=box-a", {"planner-1"}),
        ("host__isnull=True", {"zed-1"}),
        ("q=planner", {"planner-1"}),
        ("q=zed", {"zed-1"}),
    ],
)
def test_each_filter_and_the_search_narrow_the_changelist(staff, fleet, query, expected):
    response = staff.get(f"{CHANGELIST}?{query}")
    assert response.status_code == 200
    assert listed(response) == expected


def test_the_environment_filter_narrows_to_one_tenant(staff, fleet, acme, globex):
    response = staff.get(f"{CHANGELIST}?environment__id__exact={globex.environment.id}")
    assert response.status_code == 200
    assert listed(response) == {"zed-1"}
    response = staff.get(f"{CHANGELIST}?environment__id__exact={acme.environment.id}")
    assert listed(response) == {"planner-1", "coder-1"}


def test_rows_are_read_only_and_cannot_be_added(staff, fleet):
    change = staff.get(reverse("admin:agents_registration_change", args=[fleet["planner-1"].pk]))
    assert change.status_code == 200
    assert 'name="instance"' not in change.content.decode()  # shown, not editable
    assert staff.get(reverse("admin:agents_registration_add")).status_code == 403
    staff.post(reverse("admin:agents_registration_change", args=[fleet["planner-1"].pk]), {"instance": "hijacked"})
    assert Registration.objects.get(pk=fleet["planner-1"].pk).instance == "planner-1"


def test_remove_selected_removes_only_the_selected_rows(staff, fleet):
    response = staff.post(
        CHANGELIST,
        {"action": "remove_selected", "_selected_action": [fleet["coder-1"].pk, fleet["zed-1"].pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Removed 2 registration(s)." in response.content.decode()
    assert set(Registration.objects.values_list("instance", flat=True)) == {"planner-1"}


def test_a_non_staff_user_is_sent_to_the_login_page(fleet):
    client = Client()
    client.force_login(StaffUser.objects.create_user("visitor", password="pw"))
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert Client().get(CHANGELIST).status_code == 302
