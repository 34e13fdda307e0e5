"""What belongs to one event loop: a per-loop object, and a join every caller of a loop shares.

A Redis client, its timers and a group subscription belong to the loop they were made on. Daphne
runs one loop per process; the in-process tests run each test on a fresh loop and get fresh,
independent objects.
"""

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """One `T` per running event loop, made by `factory` on first use: call it to get this loop's."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        found = self._made.get(loop)
        if found is None:
            found = self._made[loop] = self._factory()
        return found

    def existing(self) -> T | None:
        """This loop's `T` if one was made, without making one."""
        return self._made.get(asyncio.get_running_loop())

    def every(self) -> list[T]:
        """Every loop's `T` whose loop is still alive (for shutdown)."""
        return list(self._made.values())


class SharedOnce:
    """An awaitable `make()` run once and awaited by every caller; run again after it failed.

    Shielded: one caller cancelled midway (a connect whose client left) must not cancel what every
    other caller waits for. Not per loop by itself: it belongs to the per-loop object that holds it.
    """

    def __init__(self, make: Callable[[], Awaitable[None]]) -> None:
        self._make = make
        self._task: asyncio.Future | None = None

    async def __call__(self) -> None:
        task = self._task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._task = asyncio.ensure_future(self._make())
        await asyncio.shield(task)

    def reset(self) -> None:
        """Forget that it ran: the next caller runs `make()` again."""
        self._task = None
