"""Small Redis helpers shared by the health checks and management commands."""

import redis


def ping(url: str, timeout: float = 0.5) -> str:
    """Return "ok" when the Redis at `url` answers PING within `timeout`, else the error's name."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
        return "ok"
    except redis.RedisError as error:
        return type(error).__name__
    finally:
        client.close()
