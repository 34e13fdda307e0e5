"""The one place that knows how this process reaches a Redis: every client Relay opens comes from here.

The channel layer reaches its Redis through `settings.CHANNEL_LAYERS` (channels-redis builds its
own pools); everything else (presence, health checks) asks here, with the URL it is configured
with.
"""

import redis
import redis.asyncio as aioredis


def async_client(url: str, **options: object) -> aioredis.Redis:
    """An asyncio client of the Redis at `url` (`options` as redis-py's own)."""
    return aioredis.Redis.from_url(url, **options)


def sync_client(url: str, **options: object) -> redis.Redis:
    """A blocking client of the Redis at `url`, for views, admin and commands (`options` as redis-py's own)."""
    return redis.Redis.from_url(url, **options)
