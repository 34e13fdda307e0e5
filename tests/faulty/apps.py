"""Handlers that fail on purpose, registered the way any app registers its own.

`test.fail` raises inside its frame handler, quoting what the client sent (which must never reach
a log line). `test.crash` queues the event `test.crashed` for the connection itself, whose handler
raises: channel-layer events have no frame guard, so that exception ends the consumer, and Daphne
closes the socket 1011.
"""

from typing import TYPE_CHECKING

from django.apps import AppConfig

from relay.frames import Identifier, StrictModel

if TYPE_CHECKING:
    from relay.consumers import GatewayConsumer


class Quote(StrictModel):
    words: Identifier


class Empty(StrictModel):
    pass


class FaultyConfig(AppConfig):
    name = "tests.faulty"
    label = "faulty"

    def ready(self) -> None:
        from relay import registry

        @registry.frame("test.fail", Quote)
        async def fail(conn: "GatewayConsumer", payload: Quote) -> None:
            raise RuntimeError(f"the handler choked on {payload.words}")

        @registry.frame("test.crash", Empty)
        async def crash(conn: "GatewayConsumer", payload: Empty) -> None:
            await conn.channel_layer.send(conn.channel_name, {"type": "test.crashed"})

        @registry.event("test.crashed")
        async def crashed(conn: "GatewayConsumer", event: dict) -> None:
            raise RuntimeError("an event handler failed")
