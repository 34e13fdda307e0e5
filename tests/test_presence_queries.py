"""Presence's plain-SQL reads, on the database the suite runs (SQLite or PostgreSQL)."""

from presence.queries import channel_ids_of_member


def test_a_members_channels_are_read_within_their_tenant_only(acme, globex):
    environment_id = str(acme.environment.id)
    fleet, general = str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    assert channel_ids_of_member(environment_id, "linh") == {fleet, general}
    # globex's linh is another person: her channel is not acme's linh's.
    assert channel_ids_of_member(str(globex.environment.id), "linh") == {str(globex.channels["board"].id)}
    assert channel_ids_of_member(environment_id, "hermit") == set()
    assert channel_ids_of_member(environment_id, "nobody") == set()
