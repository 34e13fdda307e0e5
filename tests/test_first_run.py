"""A welcoming `make run`: first-run data, the demo superuser, the URLs printed."""

import json
from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from devtools.devserver import welcome
from relay.models import Environment

pytestmark = pytest.mark.django_db

Staff = get_user_model()


def setupdemo() -> tuple[str, dict]:
    """Run setupdemo; return everything it printed and its last line's JSON summary."""
    out = StringIO()
    call_command("setupdemo", stdout=out, stderr=StringIO())
    return out.getvalue(), json.loads(out.getvalue().strip().splitlines()[-1])


def test_with_relay_demo_a_superuser_admin_is_created_once_with_the_password_printed(settings):
    settings.RELAY_DEMO = True
    _, summary = setupdemo()
    assert summary["admin_user"] == "admin"
    admin = authenticate(username="admin", password=summary["admin_password"])
    assert admin is not None
    assert admin.is_superuser and admin.is_staff
    printed, again = setupdemo()
    assert "admin_password" not in again
    assert summary["admin_password"] not in printed
    assert Staff.objects.count() == 1


def test_without_relay_demo_no_superuser_is_created(settings):
    settings.RELAY_DEMO = False
    _, summary = setupdemo()
    assert "api_key" in summary
    assert "admin_password" not in summary
    assert not Staff.objects.exists()


def test_the_superuser_is_created_on_a_later_start_when_relay_demo_is_set_then(settings):
    settings.RELAY_DEMO = False
    setupdemo()
    settings.RELAY_DEMO = True
    _, summary = setupdemo()
    assert "api_key" not in summary  # the environment already existed: its key is not shown again
    assert Staff.objects.get(username="admin").is_superuser


def test_no_superuser_is_created_when_one_exists(settings):
    Staff.objects.create_superuser(username="root", email="", password="x-long-enough-password")
    settings.RELAY_DEMO = True
    _, summary = setupdemo()
    assert "admin_password" not in summary
    assert list(Staff.objects.values_list("username", flat=True)) == ["root"]


def test_an_ordinary_user_named_admin_is_not_promoted(settings):
    Staff.objects.create_user(username="admin", password="x-long-enough-password")
    settings.RELAY_DEMO = True
    _, summary = setupdemo()
    assert "admin_password" not in summary
    assert not Staff.objects.get(username="admin").is_superuser
    assert Environment.objects.filter(name="local").exists()


def test_setupdemo_leaves_a_database_with_other_environments_alone(make_tenant, settings):
    settings.RELAY_DEMO = False
    make_tenant("acme")
    out = StringIO()
    call_command("setupdemo", stdout=out)
    assert list(Environment.objects.values_list("name", flat=True)) == ["acme"]
    assert "api_key" not in out.getvalue()


def test_the_welcome_names_the_client_admin_and_the_secrets_created_on_this_start():
    summary = {"environment": "e1", "name": "local", "api_key": "rk_secret", "admin_user": "admin"}
    text = welcome("http://127.0.0.1:8000/", {**summary, "admin_password": "pw123"})
    assert "demo client  http://127.0.0.1:8000/ " in text
    assert "admin        http://127.0.0.1:8000/admin/" in text
    assert "password pw123" in text
    assert "rk_secret" in text
    later = welcome("http://127.0.0.1:8000/", {"environment": "e1", "name": "local"})
    assert "http://127.0.0.1:8000/admin/" in later
    assert "rk_" not in later
    assert "RELAY_DEMO=1" in later
