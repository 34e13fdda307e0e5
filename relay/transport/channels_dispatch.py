"""Channels' consumer `dispatch` without the database-connection cleanup it runs before every handler.

`channels.consumer.AsyncConsumer.dispatch` awaits `aclose_old_connections()` before each
handler: a hop to the database worker thread per connect, client frame and close (a quarter of
a connect's thread work), even for handlers that never touch the database. Relay touches the
database only through `database_sync_to_async`, which runs the same cleanup around each call,
where a connection is actually used; so the per-message hop buys nothing.

Written against channels 4.2-4.3 (requirements.txt pins the range). Upstream: none open yet.
Guard: tests/test_transport_guards.py (Channels' own dispatch still cleans up before each
handler, and this one routes to the handler Channels would, without the hop).
"""

from channels.consumer import get_handler_name


class DispatchWithoutCleanup:
    """A consumer mixin: `dispatch` as Channels writes it, minus `aclose_old_connections()`."""

    async def dispatch(self, message: dict) -> None:
        """Call the handler named after the message's `type`, as Channels does."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)
