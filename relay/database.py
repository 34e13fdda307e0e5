"""Database connections of HTTP requests: closed when the request ends.

Django's ASGI handler runs each request's sync code in a context of its own, and connections
live per context, so a connection kept open for reuse (`CONN_MAX_AGE`, which the WebSocket
path relies on: relay/settings.py) is never reused by a later request: each would leave one
open behind it, three file descriptors with SQLite, until the process runs out of them.
(PostgreSQL goes through a pool and hands its connection back instead.)
"""

from typing import Any

from django.db import connections


def close_request_connections(**kwargs: Any) -> None:
    """Close the finished request's database connections (Django's `request_finished` receiver).

    One inside a transaction is left alone: a test's, around requests made with the test client.
    """
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()
