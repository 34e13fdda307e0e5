"""Time on this instance: when a timer fires and when a periodic task runs next.

Each module that schedules names its clock once (`presence.actions.clock`, `relay.reconcile.clock`,
`agents.sweeper.clock`, as `agents.actions.clock` is the registry's "now"): tests replace it with
one they advance by hand instead of sleeping. Redis keeps its own time for keys and deadlines
(its TIME inside the scripts), which every instance shares.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol


class Timer(Protocol):
    """A pending call that can still be cancelled."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Schedules timers and waits."""

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


class Periodic:
    """`work()` every `interval()` seconds on `clock()`, while `wanted()`, one round at a time.

    A timer rather than a sleeping task: a loop that ends (each in-process test's) leaves no
    pending task behind, and while it is not wanted nothing runs at all; `start` arms it again.
    An exception from `work` is handed to `failed` and the next round still comes.
    """

    def __init__(
        self,
        work: Callable[[], Awaitable[object]],
        interval: Callable[[], float],
        clock: Callable[[], Clock],
        failed: Callable[[Exception], None],
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        self._work = work
        self._interval = interval
        self._clock = clock
        self._failed = failed
        self._wanted = wanted
        self._timer: Timer | None = None
        self.running: asyncio.Task | None = None
        self._again = False
        self._stopped = False

    @property
    def armed(self) -> bool:
        """A round is scheduled or in progress."""
        return self._timer is not None or self.running is not None

    def start(self) -> None:
        """Run a round one interval from now, unless one is already scheduled or running."""
        self._stopped = False
        if not self.armed:
            self._schedule()

    def run_soon(self) -> None:
        """Run a round now, or right after the one in progress."""
        self._stopped = False
        if self.running is not None:
            self._again = True
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._run()

    def cancel(self) -> None:
        """Stop at once: the timer, and the round in progress (cancelled where it waits)."""
        self._stop_scheduling()
        if self.running is not None:
            self.running.cancel()

    async def stop(self) -> None:
        """Stop, letting a round in progress finish first (its worker thread cannot be cancelled)."""
        self._stop_scheduling()
        if self.running is not None:
            await asyncio.shield(self.running)

    async def settled(self) -> None:
        """Return once no round is in progress (for tests that move the clock by hand)."""
        while self.running is not None:
            await asyncio.shield(self.running)

    def _stop_scheduling(self) -> None:
        self._stopped = True
        self._again = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        self._timer = self._clock().call_later(self._interval(), self._due)

    def _due(self) -> None:
        self._timer = None
        self._run()

    def _run(self) -> None:
        self.running = asyncio.ensure_future(self._round())

    async def _round(self) -> None:
        try:
            await self._work()
        except Exception as error:
            self._failed(error)
        finally:
            self.running = None
            if self._again and not self._stopped:
                self._again = False
                self._run()
            elif self._wanted() and not self._stopped:
                self._schedule()
