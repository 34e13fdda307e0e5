"""Presence's time on this instance: when a grace check fires and when the refresh runs.

`actions.clock` is the one source of it (as `agents.actions.clock` is for the
registry): tests replace it with one they advance by hand instead of sleeping. Redis keeps its
own time for keys and deadlines (its TIME inside the scripts), which every instance shares.
"""

import asyncio
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """A pending call that can still be cancelled."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Schedules presence's timers and waits."""

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Timer:
        """Call `callback` once, `seconds` from now, on the running event loop."""

    async def sleep(self, seconds: float) -> None:
        """Return `seconds` from now."""


class LoopClock:
    """The event loop's own time."""

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(seconds, callback)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
