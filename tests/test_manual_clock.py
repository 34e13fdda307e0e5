"""The ManualClock presence's in-process tests run on: timers run in due order, only once due, never when cancelled.

The grace tests' "nothing before the advance" rests on it, so it is held to its own promises here.
"""

import asyncio

import pytest

from tests.support import ManualClock


def test_timers_run_soonest_first_and_only_once_due():
    clock = ManualClock()
    ran: list[str] = []
    clock.call_later(2.0, lambda: ran.append("late"))
    clock.call_later(1.0, lambda: ran.append("early"))
    clock.call_later(1.0, lambda: ran.append("early, made second"))
    clock.advance(0.75)
    assert ran == []
    clock.advance(0.25)
    assert ran == ["early", "early, made second"]
    clock.advance(5.0)
    assert ran == ["early", "early, made second", "late"]
    assert clock.now == 6.0


def test_a_timer_due_inside_one_advance_runs_in_it_and_a_cancelled_one_never():
    clock = ManualClock()
    ran: list[str] = []
    cancelled = clock.call_later(0.5, lambda: ran.append("cancelled"))
    # Scheduled by a callback, due before the advance ends: it runs in the same advance.
    clock.call_later(1.0, lambda: clock.call_later(0.5, lambda: ran.append("chained")))
    cancelled.cancel()
    clock.advance(2.0)
    assert ran == ["chained"]
    assert cancelled.cancelled()


async def test_sleep_returns_when_the_clock_reaches_it_and_not_before():
    clock = ManualClock()
    sleeper = asyncio.ensure_future(clock.sleep(10.0))
    await asyncio.sleep(0)
    clock.advance(9.0)
    await asyncio.sleep(0)
    assert not sleeper.done()
    clock.advance(1.0)
    await asyncio.wait_for(sleeper, 1.0)
    # A sleeper cancelled meanwhile (a stopped refresh) is left alone when its time comes.
    cancelled = asyncio.ensure_future(clock.sleep(1.0))
    await asyncio.sleep(0)
    cancelled.cancel()
    clock.advance(1.0)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
