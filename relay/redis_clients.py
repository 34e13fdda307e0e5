"""The one place that knows how this process reaches a Redis: every client Relay opens comes from here.

A Redis is named by its URL. When RELAY_REDIS_SENTINELS is set, the URL that is RELAY_REDIS_URL
is reached through Redis Sentinel instead: the sentinels name its master (RELAY_REDIS_SENTINEL_MASTER),
and the URL's database, user and password still apply; every client then follows a failover on
its next connection. The channel layer reaches its Redis through `settings.CHANNEL_LAYERS`
(channels-redis builds its own pools from `layer_host`; on a Redis Cluster, relay/transport/cluster.py
its own client); everything else (presence, health checks) asks here, with the URL it is configured with.
"""

from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.sentinel import Sentinel

# Short: a sentinel that does not answer is skipped for the next one.
SENTINEL_TIMEOUT_SECONDS = 0.5
# Connecting to a Redis whose host is gone (rather than its process) fails after this, not when
# TCP gives up minutes later: the channel layer's publishes and subscriptions wait on it.
CONNECT_SECONDS = 1.0


def _through_sentinels(url: str) -> bool:
    return bool(settings.RELAY_REDIS_SENTINELS) and url == settings.RELAY_REDIS_URL


def _master_options(url: str) -> dict[str, Any]:
    """What of `url` still applies to the master the sentinels name: database, user, password, TLS."""
    parsed = parse_url(url)
    options = {key: parsed[key] for key in ("db", "username", "password") if parsed.get(key) is not None}
    # parse_url names TLS by its connection class, which a sentinel pool replaces with its own:
    # `ssl` is what makes that one speak TLS (rediss://), as the URL asked.
    if urlsplit(url).scheme == "rediss":
        options["ssl"] = True
    return options


def layer_host(url: str, sentinels: list[tuple[str, int]], master: str) -> dict[str, Any]:
    """The channels-redis host entry for the Redis at `url`, through `sentinels` when there are any."""
    if not sentinels:
        return {"address": url, "socket_connect_timeout": CONNECT_SECONDS}
    return {
        "sentinels": list(sentinels),
        "master_name": master,
        "sentinel_kwargs": {"socket_timeout": SENTINEL_TIMEOUT_SECONDS},
        "socket_connect_timeout": CONNECT_SECONDS,
        **_master_options(url),
    }


def is_layer_redis(host: dict[str, Any], url: str) -> bool:
    """True when the channels-redis host entry `host` is the Redis that `url` names."""
    if _through_sentinels(url):
        return host == layer_host(url, settings.RELAY_REDIS_SENTINELS, settings.RELAY_REDIS_SENTINEL_MASTER)
    return host.get("address") == url


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client of the Redis at `url` (`options` as redis-py's own)."""
    if _through_sentinels(url):
        sentinel = AsyncSentinel(
            settings.RELAY_REDIS_SENTINELS, sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT_SECONDS}
        )
        return sentinel.master_for(settings.RELAY_REDIS_SENTINEL_MASTER, **_master_options(url), **options)
    return aioredis.Redis.from_url(url, **options)


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client of the Redis at `url`, for views, admin and commands (`options` as redis-py's own)."""
    if _through_sentinels(url):
        sentinel = Sentinel(
            settings.RELAY_REDIS_SENTINELS, sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT_SECONDS}
        )
        return sentinel.master_for(settings.RELAY_REDIS_SENTINEL_MASTER, **_master_options(url), **options)
    return redis.Redis.from_url(url, **options)


def cluster_sync_client(nodes: list[tuple[str, int]], **options: Any) -> RedisCluster:
    """A blocking client of the Redis Cluster that `nodes` (`host`, `port`) belong to, for health checks."""
    return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in nodes], **options)


def cluster_options(url: str) -> dict[str, Any]:
    """What of `url` applies to a Redis Cluster's nodes: user, password, and TLS for `rediss://`."""
    parsed = parse_url(url)
    options = {key: parsed[key] for key in ("username", "password") if parsed.get(key) is not None}
    if url.startswith("rediss://"):
        options["ssl"] = True
    return options
