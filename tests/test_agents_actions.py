"""The registry's writes under races, on whichever database DATABASE_URL names (SQLite or PostgreSQL)."""

import threading

import pytest
from django.core.management import call_command
from django.db import connection

from agents.actions import do_register
from agents.exceptions import InstanceOwned
from agents.models import Registration
from relay.frames import Capability


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_number", range(5))
def test_threads_racing_to_register_one_instance_for_two_identities_leave_one_owner(acme, round_number):
    instance = f"race-{round_number}"
    outcomes: dict[str, str] = {}
    start = threading.Barrier(4)

    def register_as(user_id: str) -> None:
        try:
            start.wait()
            do_register(acme.users[user_id], instance, Capability(host=f"{user_id}-box"), f"conn-{user_id}")
            outcomes[user_id] = "registered"
        except InstanceOwned:
            outcomes[user_id] = "refused"
        finally:
            connection.close()

    # Two threads per identity: the owner's second registration must be refreshed, not refused.
    threads = [threading.Thread(target=register_as, args=(user_id,)) for user_id in ("linh", "linh", "tuan", "tuan")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    row = Registration.objects.select_related("identity").get(environment=acme.environment, instance=instance)
    owner = row.identity.external_id
    other = "tuan" if owner == "linh" else "linh"
    assert outcomes == {owner: "registered", other: "refused"}
    assert row.host == f"{owner}-box"
    assert Registration.objects.filter(instance=instance).count() == 1


@pytest.mark.django_db
def test_the_agents_schema_has_its_migration():
    # The seed's schema drift guard, the Django way: a model change without a migration fails here.
    call_command("makemigrations", "agents", "--check", "--dry-run", verbosity=0)
