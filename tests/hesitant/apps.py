"""The first grace check of a process held after it read the user's channels, until the test releases it (SIGUSR1).

As a check whose script reaches Redis after a membership committed since its read.
`test.check_held` is logged when the check is held.
"""

import asyncio
import contextvars
import logging
import signal

from django.apps import AppConfig


class HesitantConfig(AppConfig):
    name = "tests.hesitant"
    label = "hesitant"

    def ready(self) -> None:
        from presence import actions
        from relay.logging import log_event

        logger = logging.getLogger("tests.hesitant")
        read = actions.read_channel_ids
        check = actions.PresenceService._grace_check
        # Set inside a grace check's task: other readers of the channels (a status announced) pass.
        checking = contextvars.ContextVar("checking", default=False)
        released: list[asyncio.Event] = []

        async def grace_check(self: actions.PresenceService, *args: object, **kwargs: object) -> None:
            checking.set(True)
            await check(self, *args, **kwargs)

        async def held(environment_id: str, user_id: str) -> set[str]:
            found = await read(environment_id, user_id)
            if checking.get() and not released:
                released.append(asyncio.Event())
                asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, released[0].set)
                log_event(logger, "test.check_held")
                await released[0].wait()
            return found

        actions.PresenceService._grace_check = grace_check
        actions.read_channel_ids = held
