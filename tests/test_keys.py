"""The cluster key layout: a user's keys and their bucket's shared keys hash to one slot."""

from redis.crc import key_slot

from presence import scripts, status
from presence.keys import BUCKETS, bucket_tag, channel_tag, user_bucket, user_tag
from webhooks.stream import stream_key

ENV = "6f1c3a52-0000-4000-8000-000000000001"


def test_a_users_keys_and_their_buckets_keys_share_one_slot():
    tag = user_tag(ENV, "linh")
    slots = {key_slot(f"presence:{tag}:{name}".encode()) for name in ("key", "marker", "status")}
    assert slots == {key_slot(f"events:{bucket_tag(user_bucket(ENV, 'linh'))}".encode())}


def test_every_key_a_users_script_touches_is_in_their_buckets_slot():
    bucket = user_bucket(ENV, "linh")
    keys = [
        scripts.presence_key(ENV, "linh"),
        scripts.marker_key(ENV, "linh"),
        scripts.connections_key(ENV, "linh"),
        scripts.channels_key(ENV, "linh"),
        scripts.user_deadlines_key(ENV, "linh"),
        scripts.user_epoch_key(ENV, "linh"),
        scripts.deadlines_key(bucket),
        scripts.epoch_key(bucket),
        status.status_key(ENV, "linh"),
        status.devices_key(ENV, "linh"),
        stream_key(bucket),
    ]
    assert len(set(keys)) == len(keys) - 2
    assert {key_slot(key.encode()) for key in keys} == {key_slot(bucket_tag(bucket).encode())}
    # Another tenant's linh is another person: other keys.
    assert scripts.presence_key("6f1c3a52-0000-4000-8000-000000000002", "linh") != scripts.presence_key(ENV, "linh")


def test_the_same_user_in_two_tenants_is_two_people():
    other = "6f1c3a52-0000-4000-8000-000000000002"
    buckets = {user_bucket(env, f"user-{n}") for env in (ENV, other) for n in range(2000)}
    # Spread over every bucket, and stable: the bucket is a pure function of tenant and user.
    assert buckets == set(range(BUCKETS))
    assert user_bucket(ENV, "linh") == 6
    # The tenant is part of the name: the same id in another tenant lands elsewhere (mostly).
    assert sum(user_bucket(ENV, f"u{n}") != user_bucket(other, f"u{n}") for n in range(100)) > 90


def test_a_channels_keys_share_a_slot_apart_from_another_channels():
    first, second = channel_tag("a3c1"), channel_tag("b7d2")
    assert key_slot(f"x:{first}:online".encode()) == key_slot(f"y:{first}:count".encode())
    assert key_slot(f"x:{first}:online".encode()) != key_slot(f"x:{second}:online".encode())
