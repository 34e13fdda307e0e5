"""relay.batching.GroupCommit: one batch in flight, the rest together in the next, an outcome each."""

import asyncio

import pytest

from relay.batching import GroupCommit


async def test_items_submitted_during_a_batch_go_together_in_the_next():
    sent: list[list[int]] = []
    first_in_flight = asyncio.Event()

    async def send(items: list[int]) -> list[int | Exception]:
        sent.append(items)
        if len(sent) == 1:
            first_in_flight.set()
            await asyncio.sleep(0.05)
        return [item * 10 if item != 3 else ValueError("three") for item in items]

    batches = GroupCommit(send)
    first = asyncio.ensure_future(batches.submit(1))
    await first_in_flight.wait()
    rest = [asyncio.ensure_future(batches.submit(item)) for item in (2, 3, 4)]
    assert await first == 10
    outcomes = await asyncio.gather(*rest, return_exceptions=True)
    assert sent == [[1], [2, 3, 4]]
    # Each caller has its own outcome: 3 alone failed.
    assert outcomes[0] == 20 and outcomes[2] == 40
    assert isinstance(outcomes[1], ValueError)
    # Idle again: the next item goes at once, alone.
    assert await batches.submit(5) == 50
    assert sent[-1] == [5]


async def test_a_batch_that_fails_as_a_whole_fails_each_of_its_callers():
    async def send(items: list[str]) -> list[str]:
        raise ConnectionError("down")

    batches = GroupCommit(send)
    for outcome in await asyncio.gather(*(batches.submit(x) for x in "abc"), return_exceptions=True):
        assert isinstance(outcome, ConnectionError)
    # The sender recovers: a later batch is sent again (and fails again, on its own).
    with pytest.raises(ConnectionError):
        await batches.submit("d")


async def test_a_cancelled_caller_does_not_disturb_the_others():
    release = asyncio.Event()

    async def send(items: list[int]) -> list[int]:
        await release.wait()
        return items

    batches = GroupCommit(send)
    kept, dropped = asyncio.ensure_future(batches.submit(1)), asyncio.ensure_future(batches.submit(2))
    await asyncio.sleep(0)
    dropped.cancel()
    release.set()
    assert await kept == 1
    assert dropped.cancelled()
