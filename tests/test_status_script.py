"""presence/status.py's scripts on the real Redis: the devices' idle, and the status cache's fill and reads."""

import asyncio

import pytest

from presence import actions
from presence.keys import user_tag
from presence.status import (
    DEVICES_SCRIPT,
    FILL_SCRIPT,
    READ_SCRIPT,
    Status,
    cached_statuses,
    devices_key,
    status_key,
)
from presence.store import PresenceStore, Timings

ENV = "00000000-0000-0000-0000-000000000001"
TIMINGS = Timings(grace=600, ttl=1000, refresh=200, margin=100, max_connections=3)


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


def test_the_read_script_gives_a_default_status_as_its_idle_and_any_other_as_its_fields(redis_client):
    script = redis_client.register_script(READ_SCRIPT)
    redis_client.hset(status_key(ENV, "linh"), mapping={**Status().cache_fields(), "idle": "1"})
    redis_client.hset(status_key(ENV, "tuan"), mapping={**Status(status="busy", text="on a call").cache_fields()})
    redis_client.hset(status_key(ENV, "hermit"), "idle", "0")  # idle written, no status cached
    keys = [status_key(ENV, user) for user in ("linh", "tuan", "hermit", "nobody")]
    assert script(keys=keys) == [1, ["busy", "on a call", "", "", "0", None], [None] * 5 + ["0"], [None] * 6]


def test_the_fill_writes_a_status_only_where_none_is_cached(redis_client):
    fill = redis_client.register_script(FILL_SCRIPT)
    fields = [part for pair in Status(status="away").cache_fields().items() for part in pair]
    redis_client.hset(status_key(ENV, "tuan"), "idle", "1")
    fill(keys=[status_key(ENV, "tuan")], args=fields)
    assert redis_client.hgetall(status_key(ENV, "tuan"))["s"] == "away"
    # A status set after the connect read the table is newer: the fill leaves it.
    redis_client.hset(status_key(ENV, "tuan"), "s", "dnd")
    fill(keys=[status_key(ENV, "tuan")], args=fields)
    assert redis_client.hgetall(status_key(ENV, "tuan")) == {**Status(status="dnd").cache_fields(), "idle": "1"}


async def test_reads_made_together_go_in_one_call_with_each_key_once(redis_client, close_presence_service):
    for user in ("a", "b", "d"):
        redis_client.hset(status_key(ENV, user), mapping={**Status().cache_fields(), "idle": "0"})
    redis_client.hset(status_key(ENV, "b"), "idle", "1")
    redis_client.hset(status_key(ENV, "c"), mapping={**Status(status="busy").cache_fields(), "idle": "0"})
    redis_client.config_resetstat()
    first, second = await asyncio.gather(cached_statuses(ENV, ["a", "b", "c"]), cached_statuses(ENV, ["b", "c", "d"]))
    assert first == {"a": (Status(), False), "b": (Status(), True), "c": (Status(status="busy"), False)}
    assert second == {"b": (Status(), True), "c": (Status(status="busy"), False), "d": (Status(), False)}
    # Four users, each read once, though six were asked for.
    assert redis_client.info("commandstats")["cmdstat_hmget"]["calls"] == 4


async def test_a_read_goes_in_the_batch_of_other_scripts_and_its_failure_fails_only_its_readers(
    redis_client, close_presence_service
):
    store = actions.service().store
    redis_client.hset(status_key(ENV, "a"), mapping={**Status(status="busy").cache_fields(), "idle": "0"})
    redis_client.set(status_key(ENV, "broken"), "not a hash")
    read, fill = store.script(READ_SCRIPT), store.script(FILL_SCRIPT)
    filled = Status(status="dnd").cache_fields()
    fields = [part for pair in filled.items() for part in pair]
    await store.read_each(read, [status_key(ENV, "a")])  # both scripts loaded before counting
    await store.run_script(fill, [status_key(ENV, "e")], fields)
    redis_client.delete(status_key(ENV, "e"))
    redis_client.config_resetstat()
    # Made together: one round trip, the fill beside one READ call with "a" once.
    outcomes = await asyncio.gather(
        store.run_script(fill, [status_key(ENV, "e")], fields),
        store.read_each(read, [status_key(ENV, "a")]),
        store.read_each(read, [status_key(ENV, "a"), status_key(ENV, "broken")]),
        return_exceptions=True,
    )
    stats = redis_client.info("commandstats")
    assert (stats["cmdstat_evalsha"]["calls"], stats["cmdstat_hmget"]["calls"]) == (2, 2)
    # The fill ran; the broken key failed the READ call for both of its readers.
    assert outcomes[0] == 0
    assert redis_client.hgetall(status_key(ENV, "e")) == filled
    assert all("WRONGTYPE" in str(outcome) for outcome in outcomes[1:])

    # Without the broken key, each reader gets its own values.
    first, second = await asyncio.gather(
        store.read_each(read, [status_key(ENV, "a")]),
        store.read_each(read, [status_key(ENV, "e"), status_key(ENV, "a")]),
    )
    assert [Status.from_cache(values) for values in first + second] == [
        Status(status="busy"),
        Status(status="dnd"),
        Status(status="busy"),
    ]


@pytest.mark.cluster
async def test_on_a_cluster_one_read_of_users_in_many_slots_gets_each_ones_values(redis_cluster):
    # A call whose keys span slots fails CROSSSLOT, which a snapshot would hide (it falls back to
    # the table): the batch must split the read by slot and put the replies back in order.
    redis_cluster.flush()
    host, port = redis_cluster.addresses[0].rsplit(":", 1)
    store = PresenceStore("redis://", TIMINGS, cluster_nodes=[(host, int(port))])
    users = [f"u{i}" for i in range(40)]
    keys = [status_key(ENV, user) for user in users]
    try:
        assert len({store.client.keyslot(key) for key in keys}) > 1
        for user, key in zip(users[::3], keys[::3], strict=True):
            await store.client.hset(key, mapping={**Status(status="busy", text=user).cache_fields(), "idle": "0"})
        read = store.script(READ_SCRIPT)
        values, again = await asyncio.gather(store.read_each(read, keys), store.read_each(read, keys[::-1]))
        expected = [Status(status="busy", text=user) if i % 3 == 0 else None for i, user in enumerate(users)]
        assert [Status.from_cache(value) if isinstance(value, list) else None for value in values] == expected
        assert again == values[::-1]
    finally:
        await store.close()
