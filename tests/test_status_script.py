"""presence/status.py's devices script on the real Redis: idle is every counted connection's."""

from presence.keys import user_tag
from presence.status import DEVICES_SCRIPT, devices_key, status_key

ENV = "00000000-0000-0000-0000-000000000001"


def run(redis_client, op: str, ttl: int, *args: str) -> list[int]:
    script = redis_client.register_script(DEVICES_SCRIPT)
    return script(keys=[devices_key(ENV, "tuan"), status_key(ENV, "tuan")], args=[op, ttl, *args])


def test_the_user_is_idle_while_every_counted_connection_is_and_each_flip_is_reported_once(redis_client):
    assert run(redis_client, "put", 60_000, "phone", "mobile|0|1") == [0, 0]
    assert run(redis_client, "put", 60_000, "phone", "mobile|1|1") == [1, 1]  # the only one: idle
    assert run(redis_client, "put", 60_000, "laptop", "web|0|2") == [1, 0]  # a new active one
    assert run(redis_client, "put", 60_000, "laptop", "web|1|2") == [1, 1]
    assert run(redis_client, "put", 60_000, "laptop", "web|1|2") == [0, 1]  # nothing new: no flip
    assert redis_client.hget(status_key(ENV, "tuan"), "idle") == "1"


def test_a_closed_connection_counts_until_its_time_runs_out(redis_client):
    run(redis_client, "put", 60_000, "phone", "mobile|0|1")
    run(redis_client, "put", 60_000, "laptop", "web|1|2")
    # Closed, counting for the grace still: the user stays active.
    assert run(redis_client, "close", 60_000, "phone") == [0, 0]
    assert set(redis_client.hkeys(devices_key(ENV, "tuan"))) == {"phone", "laptop"}
    # Its time is up (a grace already over): it stops counting, and the user is idle.
    assert run(redis_client, "close", -1, "phone") == [1, 1]
    assert set(redis_client.hkeys(devices_key(ENV, "tuan"))) == {"laptop"}
    # The last one gone: nobody counts, so not idle.
    assert run(redis_client, "close", -1, "laptop") == [1, 0]
    assert not redis_client.exists(devices_key(ENV, "tuan"))


def test_both_keys_share_the_users_hash_tag(redis_client):
    tag = user_tag(ENV, "tuan")
    assert tag in devices_key(ENV, "tuan") and tag in status_key(ENV, "tuan")
