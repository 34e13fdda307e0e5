"""Group commit: the calls made while one round trip is in flight go together in the next.

The connect path makes two round trips per connection, one to the database thread and one to
the presence Redis, and each costs more in overhead (the thread handoff and the GIL; redis-py's
pool lock and parsing) than in the work it carries. In a burst of connects, one trip carrying
every connect waiting for it replaces hundreds of trips in flight at once (docs/performance.md).
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommit(Generic[Item, Result]):
    """Sends items in batches, one batch in flight at a time, with one outcome per item.

    `send(items)` returns, for each item in order, its result or the exception it failed with
    (an exception `send` raises fails the whole batch). An item submitted alone goes at once;
    the items submitted while a batch is in flight go together in the next one. Each caller gets
    its own outcome. One instance belongs to one event loop.
    """

    def __init__(self, send: Callable[[list[Item]], Awaitable[list[Result | Exception]]]) -> None:
        self._send = send
        self._waiting: list[tuple[Item, asyncio.Future]] = []
        self._sender: asyncio.Task | None = None

    async def submit(self, item: Item) -> Result:
        """Send `item` with the batch it falls into; return its result or raise its exception."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._send_waiting())
        return await future

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    outcomes = await self._send([item for item, _ in batch])
                except Exception as error:
                    outcomes = [error] * len(batch)
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue  # its caller was cancelled meanwhile
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._sender = None
