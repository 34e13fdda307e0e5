"""Settings of the benchmark's bare servers: Relay's, on the channel layer a comparison picks.

Relay itself runs on its own layer only (relay/layer.py); the layers comparison runs the bare
fan-out consumer (bench/bare.py) on each layer instead. BENCH_CHANNEL_LAYER: `relay` or `core`.
"""

import os

from relay.settings import *  # noqa: F403
from relay.settings import RELAY_REDIS_URL

LAYERS = {
    "relay": "relay.transport.pubsub.RelayPubSubChannelLayer",
    "core": "channels_redis.core.RedisChannelLayer",
}


def channel_layers_for(url: str, layer: str) -> dict:
    """The CHANNEL_LAYERS setting for `layer` on the Redis at `url`."""
    return {"default": {"BACKEND": LAYERS[layer], "CONFIG": {"hosts": [url], "prefix": "relay"}}}


CHANNEL_LAYERS = channel_layers_for(RELAY_REDIS_URL, os.environ.get("BENCH_CHANNEL_LAYER", "relay"))
