"""Rate limits (docs/contract.md, Fair use): frames per connection, and tokens minted per API key.

Both are the `limits` library's. A connection's frames are counted in this process's memory (a
connection lives in one process), with a sliding-window counter: two counters per connection
rather than a timestamp per frame, so a busy instance's memory does not grow with the rate; a
closed connection's counters expire with their window.
Tokens minted per API key are counted in RELAY_REDIS_URL, shared by every instance, with a
moving window (one Redis key per API key, hash-tagged: one slot on a Redis Cluster).
"""

import logging
import math
import time
from functools import cache

from django.conf import settings
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.storage import MemoryStorage, RedisStorage
from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from relay.logging import Event, log_event
from relay.redis_clients import sync_client

logger = logging.getLogger(__name__)

# A connection may send a burst of this many seconds' worth of frames at once (the contract's
# "50 a second, bursts of 100"), and no more than the rate over any such window.
FRAME_BURST_SECONDS = 2
KEY_PREFIX = "relay:limits"


def retry_after_ms(reset_time: float) -> int:
    """Milliseconds until `reset_time` (epoch seconds), at least one."""
    return max(1, math.ceil((reset_time - time.time()) * 1000))


class FrameLimiter:
    """Each connection's frames, RELAY_RATE_FRAMES_PER_S with bursts of FRAME_BURST_SECONDS' worth."""

    def __init__(self, per_second: int) -> None:
        self.item: RateLimitItem = RateLimitItemPerSecond(per_second * FRAME_BURST_SECONDS, FRAME_BURST_SECONDS)
        self.limiter = SlidingWindowCounterRateLimiter(MemoryStorage())

    def refused(self, connection_id: str) -> int | None:
        """Count one frame of the connection: None when allowed, else the milliseconds to wait."""
        if self.limiter.hit(self.item, connection_id):
            return None
        return retry_after_ms(self.limiter.get_window_stats(self.item, connection_id).reset_time)


@cache
def frames() -> FrameLimiter:
    """This process's frame limiter."""
    return FrameLimiter(settings.RELAY_RATE_FRAMES_PER_S)


class TokenLimiter:
    """Tokens minted per API key, across every instance, RELAY_RATE_TOKENS_PER_S."""

    def __init__(self, per_second: int, redis_url: str) -> None:
        self.item: RateLimitItem = RateLimitItemPerSecond(per_second)
        pool = sync_client(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0).connection_pool
        self.limiter = MovingWindowRateLimiter(RedisStorage(redis_url, connection_pool=pool, key_prefix=KEY_PREFIX))

    def refused(self, api_key_id: int) -> int | None:
        """Count one token minted with the key: None when allowed, else the milliseconds to wait.

        Redis unreachable: allowed (and logged). Minting needs only the database, and an outage
        of the shared counter should not stop every tenant's clients from connecting.
        """
        # The braces are a hash tag: the key's one slot on a Redis Cluster.
        identifier = f"{{tokens:{api_key_id}}}"
        try:
            if self.limiter.hit(self.item, identifier):
                return None
            return retry_after_ms(self.limiter.get_window_stats(self.item, identifier).reset_time)
        except Exception as error:
            log_event(logger, Event.RATE_LIMIT_FAILED, logging.ERROR, limit="tokens", error=type(error).__name__)
            return None


@cache
def tokens() -> TokenLimiter:
    """This process's limiter of tokens minted per API key."""
    return TokenLimiter(settings.RELAY_RATE_TOKENS_PER_S, settings.RELAY_REDIS_URL)
