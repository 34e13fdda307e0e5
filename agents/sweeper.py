"""Each Relay instance's periodic sweep of stale agent registrations (docs/contract.md, 5. Agents).

Daphne has no start-up hook for an app, so the sweep starts lazily on the event loop
of the first connection an instance opens and then runs for the life of that loop,
connections or not. Every instance sweeps independently; `actions.sweep_stale` makes
concurrent sweeps safe, so no instance needs to know about the others.
"""

import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings

from agents import actions
from relay.logging import log_event
from relay.registry import Connection, Extension

logger = logging.getLogger(__name__)


class Sweeper:
    """Runs `actions.sweep_stale` every RELAY_AGENT_SWEEP_MS on one event loop."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    def ensure_running(self) -> None:
        """Start the periodic sweep on the running loop unless it already runs there."""
        loop = asyncio.get_running_loop()
        # A task of another loop belongs to a loop that has ended (each test has its own).
        if self.task is not None and not self.task.done() and self.task.get_loop() is loop:
            return
        self._stopping = asyncio.Event()
        self.task = loop.create_task(self._run(self._stopping), name="agents.sweeper")

    async def stop(self) -> None:
        """End the periodic sweep, letting a sweep in progress finish first."""
        task, self.task = self.task, None
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            return
        # Not task.cancel(): a cancelled await leaves the sweep running on in its worker
        # thread, holding a database connection after the sweeper claims to have stopped.
        self._stopping.set()
        await task

    async def _run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), timeout=settings.RELAY_AGENT_SWEEP_MS / 1000)
            except TimeoutError:
                await self.sweep_once()

    async def sweep_once(self) -> int:
        """Sweep now; return how many rows were removed (0 when the sweep failed, which is logged)."""
        try:
            # Off the thread-sensitive executor: a sweep waiting for a busy SQLite write lock
            # must not hold up every other database call of this process behind it.
            swept = await database_sync_to_async(actions.sweep_stale, thread_sensitive=False)()
        except Exception as error:
            # A busy or unreachable database only delays ageing out; the next tick tries again.
            log_event(logger, "agent.sweep_failed", logging.ERROR, error=type(error).__name__)
            return 0
        return len(swept)


sweeper = Sweeper()


class SweepOnFirstConnection(Extension):
    """Starts this instance's sweeper when a connection opens (a no-op once it runs)."""

    async def opened(self, conn: Connection) -> None:
        sweeper.ensure_running()
