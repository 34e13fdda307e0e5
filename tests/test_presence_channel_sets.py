"""A channel's online set against the real Redis: kept by its own script, counted or listed, healing itself."""

import uuid

import pytest

from presence.keys import channel_tag
from presence.scripts import channel_online_key, user_epoch_key
from presence.store import PresenceStore, Timings, presence_key

ACME = str(uuid.uuid4())
TIMINGS = Timings(grace=600, ttl=1000, refresh=200, margin=100, max_connections=3)
HALL, FLEET = str(uuid.uuid4()), str(uuid.uuid4())


@pytest.fixture
async def store(redis_url):
    made = PresenceStore(redis_url, TIMINGS)
    yield made
    await made.close()


def test_a_channels_set_lives_in_the_channels_own_slot():
    assert channel_tag(HALL) in channel_online_key(HALL)
    assert channel_online_key(HALL) != channel_online_key(FLEET)


async def test_a_connect_lists_its_small_channels_and_counts_its_large_ones(store):
    await store.elect(ACME, "tuan", "c1", channels=[HALL, FLEET])
    election = await store.elect(ACME, "linh", "c2", ["linh", "tuan"], channels=[HALL, FLEET], large={HALL})
    assert election.online == ["linh", "tuan"]
    assert election.occupancy == {HALL: 2}
    # Only co-members are named: mai, online in hall alone, is not in linh's `watch`.
    await store.elect(ACME, "mai", "c3", channels=[FLEET])
    again = await store.elect(ACME, "linh", "c4", ["linh", "tuan"], channels=[FLEET])
    assert again.online == ["linh", "tuan"]


async def test_an_entry_nobody_renews_goes_by_itself_and_a_refresh_brings_it_back(store, redis_client):
    await store.elect(ACME, "tuan", "c1", channels=[HALL])
    # As an instance that died after the user's script and before the channel's would leave it:
    # an entry whose time is up. It is not counted, and the next write trims it.
    redis_client.zadd(channel_online_key(HALL), {"ghost": 1})
    assert await store.occupancy([HALL]) == {HALL: 1}
    assert redis_client.zscore(channel_online_key(HALL), "ghost") is None
    # Removed (an `offline` decided), then seen again by a refresh.
    await store.channels_gone([("tuan", [HALL])])
    assert await store.occupancy([HALL]) == {HALL: 0}
    await store.channels_seen({HALL: ["tuan"]}, TIMINGS.ttl)
    assert await store.channel_members(HALL) == ["tuan"]


async def test_a_close_pins_the_entry_to_the_grace_and_a_shorter_write_never_shortens_it(store, redis_client):
    await store.elect(ACME, "tuan", "c1", channels=[HALL])
    pinned = TIMINGS.ttl * 10
    await store.channels_seen({HALL: ["tuan"]}, pinned)
    until = redis_client.zscore(channel_online_key(HALL), "tuan")
    await store.channels_seen({HALL: ["tuan"]}, TIMINGS.ttl)
    assert redis_client.zscore(channel_online_key(HALL), "tuan") == until
    assert redis_client.pttl(channel_online_key(HALL)) > TIMINGS.ttl


async def test_the_epoch_gets_a_ttl_from_the_first_election_and_every_refresh_renews_it(store, redis_client):
    epoch = user_epoch_key(ACME, "tuan")
    await store.elect(ACME, "tuan", "c1")
    # As long as the deadline the election wrote: a close before any refresh is decided within it.
    assert TIMINGS.ttl < redis_client.pttl(epoch) <= TIMINGS.ttl + TIMINGS.grace
    await store.refresh([(f"{ACME}:tuan", None, ["c1"])])
    assert TIMINGS.ttl < redis_client.pttl(epoch) <= TIMINGS.epoch_ttl


async def decide_offline(store: PresenceStore, redis_client, user_id: str) -> int:
    """Close the user's one connection and let the grace run out; the grace check's decision time."""
    await store.release(ACME, user_id, f"{user_id}-1", last_local=True)
    redis_client.delete(presence_key(ACME, user_id))
    outcome, _, decided_ms = await store.grace_check(ACME, user_id, redis_client.get(user_epoch_key(ACME, user_id)))
    assert outcome == 1
    return decided_ms


async def test_an_offline_decided_before_a_return_takes_out_only_the_entries_written_before_it(store, redis_client):
    for user_id in ("tuan", "mai"):
        await store.elect(ACME, user_id, f"{user_id}-1", channels=[HALL])
    decided_tuan = await decide_offline(store, redis_client, "tuan")
    decided_mai = await decide_offline(store, redis_client, "mai")
    # tuan is back (his connect writes his entry) before the decider takes him out of his
    # channels' sets; mai is not.
    await store.elect(ACME, "tuan", "tuan-2", channels=[HALL])
    await store.channels_gone([("tuan", [HALL])], decided_tuan)
    await store.channels_gone([("mai", [HALL])], decided_mai)
    assert await store.channel_members(HALL) == ["tuan"]
