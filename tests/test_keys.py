"""The cluster key layout: a user's keys and their bucket's shared keys hash to one slot."""

from redis.crc import key_slot

from presence.keys import BUCKETS, bucket_tag, channel_tag, user_bucket, user_tag

ENV = "6f1c3a52-0000-4000-8000-000000000001"


def test_a_users_keys_and_their_buckets_keys_share_one_slot():
    tag = user_tag(ENV, "linh")
    slots = {key_slot(f"presence:{tag}:{name}".encode()) for name in ("key", "marker", "status")}
    assert slots == {key_slot(f"events:{bucket_tag(user_bucket(ENV, 'linh'))}".encode())}


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
