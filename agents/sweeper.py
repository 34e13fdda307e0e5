"""Each Relay instance's periodic sweep of stale agent registrations (docs/contract.md, 5. Agents).

Daphne has no start-up hook for an app, so the sweep starts lazily on the event loop
of the first connection an instance opens and then runs for the life of that loop,
connections or not. Every instance sweeps independently; `actions.sweep_stale` makes
concurrent sweeps safe, so no instance needs to know about the others.
"""

import logging

from channels.db import database_sync_to_async
from django.conf import settings

from agents import actions
from relay.clock import Clock, LoopClock, Periodic
from relay.logging import Event, log_event
from relay.loops import PerLoop
from relay.registry import Connection, Extension

logger = logging.getLogger(__name__)

# When the sweeps run (relay/clock.py); tests replace it to sweep without sleeping.
clock: Clock = LoopClock()


class Sweeper:
    """Runs `actions.sweep_stale` every RELAY_AGENT_SWEEP_MS on one event loop."""

    def __init__(self) -> None:
        self.rounds = Periodic(
            self.sweep_once,
            interval=lambda: settings.RELAY_AGENT_SWEEP_MS / 1000,
            clock=lambda: clock,
            failed=_sweep_failed,
        )

    def ensure_running(self) -> None:
        """Start the periodic sweep unless it already runs."""
        self.rounds.start()

    async def stop(self) -> None:
        """End the periodic sweep, letting a sweep in progress finish first.

        Not a cancel: a cancelled await leaves the sweep running on in its worker thread,
        holding a database connection after the sweeper claims to have stopped.
        """
        await self.rounds.stop()

    async def sweep_once(self) -> int:
        """Sweep now; return how many rows were removed (0 when the sweep failed, which is logged)."""
        try:
            # Off the thread-sensitive executor: a sweep waiting for a busy SQLite write lock
            # must not hold up every other database call of this process behind it.
            swept = await database_sync_to_async(actions.sweep_stale, thread_sensitive=False)()
        except Exception as error:
            # A busy or unreachable database only delays ageing out; the next round tries again.
            _sweep_failed(error)
            return 0
        return len(swept)


def _sweep_failed(error: Exception) -> None:
    log_event(logger, Event.AGENT_SWEEP_FAILED, logging.ERROR, error=type(error).__name__)


# This event loop's sweeper.
sweeper = PerLoop(Sweeper)


class SweepOnFirstConnection(Extension):
    """Starts this instance's sweeper when a connection opens (a no-op once it runs)."""

    async def opened(self, conn: Connection) -> None:
        sweeper().ensure_running()
