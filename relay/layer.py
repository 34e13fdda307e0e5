"""What Relay needs from its channel layer, checked once when the application starts.

Relay runs on one layer, `relay.transport.pubsub.RelayPubSubChannelLayer` (on a Redis Cluster,
its sharded form `relay.transport.cluster.RelayClusterChannelLayer`); its hooks carry
the per-process fan-out of presence, the membership bus and the batched group calls. Code
takes the layer from `channel_layer()`, typed as this protocol, instead of probing for each
hook: a layer without them fails at start-up, naming what it lacks, rather than one
connection at a time.
"""

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.exceptions import ImproperlyConfigured


class ChannelLayer(Protocol):
    """What every Channels layer offers and Relay uses."""

    async def send(self, channel: str, message: dict) -> None: ...

    async def group_send(self, group: str, message: dict) -> None: ...


class RelayLayer(ChannelLayer, Protocol):
    """A channel layer with Relay's process-wide hooks (see relay/transport/pubsub.py)."""

    async def group_send_many(self, sends: Sequence[tuple[str, dict]]) -> None: ...

    async def group_add_many(self, groups: Sequence[str], channel: str) -> None: ...

    async def group_discard_many(self, groups: Sequence[str], channel: str) -> None: ...

    def publications(self, sends: Sequence[tuple[str, dict]], redis_url: str) -> list[tuple[str, bytes]] | None: ...

    def group_channel_prefix(self, prefix: str, redis_url: str) -> str | None: ...

    def back_at(self) -> float: ...

    def lost_at(self) -> float: ...

    async def route_group(self, group: str, callback: Callable[[dict], None]) -> None: ...

    def claim_groups(self, prefix: str, callback: Callable[[dict, tuple[str, ...]], None]) -> None: ...

    def send_local(self, channel: str, message: dict) -> bool: ...

    def backlog(self, channel: str) -> int: ...

    def handled(self, channel: str) -> None: ...

    def discard_channel(self, channel: str) -> None: ...


def channel_layer() -> RelayLayer:
    """The configured channel layer, as the protocol `check_channel_layer` held it to."""
    return cast(RelayLayer, get_channel_layer())


# How long a request that changed something waits for its notice to be published: a Redis that
# stopped answering must not hold the request (the reconciliation delivers what a lost notice carried).
NOTICE_TIMEOUT_SECONDS = 2.0


def publish_notice(group: str, message: dict) -> None:
    """`group_send` from synchronous code (a view, an admin action, a command), bounded in time.

    Raises what the layer raised, or TimeoutError past NOTICE_TIMEOUT_SECONDS.
    """

    async def send() -> None:
        await asyncio.wait_for(channel_layer().group_send(group, message), NOTICE_TIMEOUT_SECONDS)

    async_to_sync(send)()


def check_channel_layer() -> None:
    """Raise ImproperlyConfigured unless the configured layer has every hook of `RelayLayer`."""
    layer = get_channel_layer()
    # Looked up on the class: channels-redis's layers answer unknown names through the running
    # event loop's layer, and there is no loop yet.
    missing = [name for name in _HOOKS if not callable(getattr(type(layer), name, None))]
    if missing:
        raise ImproperlyConfigured(
            f"CHANNEL_LAYERS['default'] is {type(layer).__name__}, which lacks {', '.join(missing)}: "
            "Relay runs on relay.transport.pubsub.RelayPubSubChannelLayer (or relay.transport.cluster's)"
        )


# Relay's own hooks; every layer has the standard API.
_HOOKS = [name for name in RelayLayer.__dict__ if not name.startswith("_")]
