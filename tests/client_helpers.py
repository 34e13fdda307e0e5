"""Helpers the relay_client tests share: an application that records every event it iterates."""

import asyncio
from collections.abc import Callable
from typing import Any

from relay_client import Client, Disconnected, Event, MessageCreated, PresenceChanged, Reconnected, RelayError


class Application:
    """Iterates `async for event in client` in a task, as an application would, and keeps every event."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.events: list[Event] = []
        self.stopped_by: RelayError | None = None
        self.ended = False
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._iterate())

    async def _iterate(self) -> None:
        try:
            async for event in self.client:
                self.events.append(event)
                self._changed.set()
        except RelayError as error:
            self.stopped_by = error
        self.ended = True
        self._changed.set()

    def messages(self, channel: str | None = None) -> list[MessageCreated]:
        return [e for e in self.events if isinstance(e, MessageCreated) and channel in (None, e.channel)]

    def seqs(self, channel: str | None = None) -> list[int]:
        return [m.seq for m in self.messages(channel)]

    def count(self, kind: type) -> int:
        return sum(isinstance(e, kind) for e in self.events)

    def presence_view(self, start: frozenset[str]) -> frozenset[str]:
        """`start` with every PresenceChanged applied in order: what an application tracking changes holds."""
        online = set(start)
        for event in self.events:
            if isinstance(event, PresenceChanged):
                (online.add if event.state == "online" else online.discard)(event.user)
        return frozenset(online)

    def reconnects(self) -> int:
        return sum(isinstance(e, Reconnected) for e in self.events)

    def disconnects(self) -> list[int]:
        return [e.code for e in self.events if isinstance(e, Disconnected)]

    async def until(self, predicate: Callable[["Application"], Any], timeout: float = 20.0) -> Any:
        """Wait until `predicate(self)` holds; return its value."""
        async with asyncio.timeout(timeout):
            while not (result := predicate(self)):
                self._changed.clear()
                await self._changed.wait()
        return result

    async def finished(self, timeout: float = 20.0) -> None:
        await asyncio.wait_for(asyncio.shield(self._task), timeout)
