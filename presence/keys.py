"""Hash tags for Redis keys laid out for Redis Cluster: every script touches one slot.

A Redis Cluster script may only touch keys of one hash slot, and every key it touches must be
declared in KEYS. So every key is built here, from one of two tags:

- a user's keys carry their **bucket**'s tag, `{b<n>}`, with n = CRC-32 of `{env}:{user}` modulo
  BUCKETS. Keys that span users (a due set, an epoch, an event stream) exist once per bucket under
  the same tag, so a script about one user can also write them, and a pass over all users is
  BUCKETS scripts (pipelined on one Redis, one shard at a time on a cluster). Buckets rather than
  a tag per user: per-user tags would leave no key that a user's script and a sweep share.
- a channel's keys carry the channel's own tag, `{c:<channel id>}`: what a large room counts is
  written by a script of that channel alone.

BUCKETS is part of the key layout: changing it moves every user to another key, which presence
(ephemeral, rebuilt by the refresh) survives and a durable stream would not.
"""

import zlib

BUCKETS = 256


def user_bucket(environment_id: str, user_id: str) -> int:
    """The bucket of one tenant's user: stable across processes and releases (CRC-32)."""
    return zlib.crc32(f"{environment_id}:{user_id}".encode()) % BUCKETS


def bucket_tag(bucket: int) -> str:
    """The hash tag shared by every key of one bucket."""
    return f"{{b{bucket}}}"


def user_tag(environment_id: str, user_id: str) -> str:
    """The hash tag of one tenant's user: their bucket's."""
    return bucket_tag(user_bucket(environment_id, user_id))


def channel_tag(channel_id: str) -> str:
    """The hash tag of one channel's keys."""
    return f"{{c:{channel_id}}}"
