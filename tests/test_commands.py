"""Operator commands: createenvironment and the first-run demo data."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from relay.models import ApiKey, Channel, Environment, User, hash_api_key

pytestmark = pytest.mark.django_db


def test_createenvironment_prints_the_id_and_a_key_that_is_stored_hashed():
    out = StringIO()
    call_command("createenvironment", "acme", stdout=out)
    printed = json.loads(out.getvalue().strip().splitlines()[-1])
    environment = Environment.objects.get(id=printed["environment"])
    assert printed["name"] == environment.name == "acme"
    key = ApiKey.objects.get(environment=environment)
    assert key.digest == hash_api_key(printed["api_key"])
    assert printed["api_key"] not in (key.prefix, key.digest)


def test_createenvironment_refuses_a_duplicate_name_and_changes_nothing():
    call_command("createenvironment", "acme", stdout=StringIO())
    with pytest.raises(CommandError, match="already exists"):
        call_command("createenvironment", "acme", stdout=StringIO())
    assert Environment.objects.count() == 1
    assert ApiKey.objects.count() == 1


def test_setupdemo_fills_an_empty_database_once():
    out = StringIO()
    call_command("setupdemo", stdout=out)
    assert Environment.objects.get().name == "local"
    assert User.objects.count() == 4
    assert Channel.objects.count() == 3
    assert "api_key" in out.getvalue()
    again = StringIO()
    call_command("setupdemo", stdout=again)
    assert (Environment.objects.count(), User.objects.count()) == (1, 4)
    assert "api_key" not in again.getvalue()
