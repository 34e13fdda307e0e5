"""The peer's settings: Relay's (same database, same Redis, same channel layer) plus its app.

BENCH_PEER_MAX_AGE_S: CHANNELS_PRESENCE_MAX_AGE, how long a presence row lives without a
heartbeat before the prune job removes it (the package's default is 60).
"""

import os

from relay.settings import *  # noqa: F403
from relay.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "channels_presence", "bench.peers.apps.PeersConfig"]
CHANNELS_PRESENCE_MAX_AGE = float(os.environ.get("BENCH_PEER_MAX_AGE_S", "60"))
