"""The first reconciliation read of a process held back until the test releases it (SIGUSR1).

As a round's read that started before a change committed, and reached the connection after that
change's notice. `test.read_held` is logged when the read is held, and `test.sync_applied` once
a connection has handled what a read made of it.
"""

import asyncio
import logging
import signal

from django.apps import AppConfig


class LaggyConfig(AppConfig):
    name = "tests.laggy"
    label = "laggy"

    def ready(self) -> None:
        from relay import reconcile, registry
        from relay.logging import log_event
        from relay.transport.pubsub import RelayPubSubLoopLayer

        logger = logging.getLogger("tests.laggy")
        read = reconcile.read_versioned_channels
        send_local = RelayPubSubLoopLayer.send_local
        released: list[asyncio.Event] = []

        async def held(user_pks: set[int]) -> dict:
            found = await read(user_pks)
            if not released:
                released.append(asyncio.Event())
                asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, released[0].set)
                log_event(logger, "test.read_held")
            await released[0].wait()
            return found

        def marked(layer: RelayPubSubLoopLayer, channel: str, message: dict) -> bool:
            delivered = send_local(layer, channel, message)
            if delivered and message.get("type") == "membership.sync":
                send_local(layer, channel, {"type": "test.sync_applied"})
            return delivered

        reconcile.read_versioned_channels = held
        RelayPubSubLoopLayer.send_local = marked

        @registry.event("test.sync_applied")
        async def applied(conn: object, event: dict) -> None:
            log_event(logger, "test.sync_applied")
