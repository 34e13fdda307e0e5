"""Rate limits (docs/contract.md, Fair use): what one connection sends, and tokens minted per API key.

All are the `limits` library's. What a connection sends is counted in this process's memory (a
connection lives in one process), every limit in one store: `ConnectionLimit`, whose excess is
the `error` `rate_limited` with `retry_after_ms`. The frames of every connection go through a
sliding-window counter: two counters per connection rather than a timestamp per frame, so a busy
instance's memory does not grow with the rate. The limits of a few frames of one kind (presence
updates, signals) take a moving window, exact at their small sizes. A closed connection's
counters expire with their window; its moving windows are forgotten as it closes.
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

from relay.exceptions import FrameError
from relay.logging import Event, log_event
from relay.redis_clients import sync_client

logger = logging.getLogger(__name__)

# A connection may send a burst of this many seconds' worth of frames at once (the contract's
# "50 a second, bursts of 100"), and no more than the rate over any such window.
FRAME_BURST_SECONDS = 2
# A connection that goes over its frame rate has every frame refused, and its socket left unread,
# for at least this long: refusing a flood as fast as it arrives costs an instance about what
# serving it would.
FRAME_PENALTY_MS = 1000
KEY_PREFIX = "relay:limits"


def retry_after_ms(reset_time: float) -> int:
    """Milliseconds until `reset_time` (epoch seconds), at least one."""
    return max(1, math.ceil((reset_time - time.time()) * 1000))


# Every connection limit of this process counts here: one store, one expiry timer.
_connections = MemoryStorage()


class ConnectionLimit:
    """At most `item` of some frames per connection (and per `scope`, such as a channel).

    `name` keeps the counts of two limits of the same rate apart. `counter`: a sliding-window
    counter (two counters per key, however many frames) instead of a moving window (a timestamp
    per frame counted, exact). The memory storage drops a counter's key when its window passes,
    but keeps a moving window's key, emptied, until it is cleared: a moving-window limit must
    `forget` every key of a connection when it closes, or each closed connection stays counted.
    """

    def __init__(self, name: str, item: RateLimitItem, *, counter: bool = False) -> None:
        self.name = name
        self.item = item
        strategy = SlidingWindowCounterRateLimiter if counter else MovingWindowRateLimiter
        self.limiter = strategy(_connections)

    def refused(self, connection_id: str, *scope: str) -> int | None:
        """Count one frame of the connection: None when allowed, else the milliseconds to wait."""
        if self.limiter.hit(self.item, self.name, connection_id, *scope):
            return None
        return retry_after_ms(self.limiter.get_window_stats(self.item, self.name, connection_id, *scope).reset_time)

    def check(self, frame_type: str, message: str, connection_id: str, *scope: str) -> None:
        """Count one frame; past the limit raise FrameError `rate_limited` with `retry_after_ms`."""
        if (wait := self.refused(connection_id, *scope)) is not None:
            raise FrameError("rate_limited", message, frame_type, wait)

    def forget(self, connection_id: str, *scope: str) -> None:
        """Drop the connection's count now (it closed) rather than when its window expires."""
        self.limiter.clear(self.item, self.name, connection_id, *scope)


@cache
def frames() -> ConnectionLimit:
    """This process's limit of each connection's frames: RELAY_RATE_FRAMES_PER_S, bursts of
    FRAME_BURST_SECONDS' worth."""
    per_second = settings.RELAY_RATE_FRAMES_PER_S
    item = RateLimitItemPerSecond(per_second * FRAME_BURST_SECONDS, FRAME_BURST_SECONDS)
    return ConnectionLimit("frames", item, counter=True)


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
