"""The webhook worker of one instance: it reads the presence streams and delivers due rows.

It also sweeps passed status expiries (presence/status.py) while an environment listens, so
their `user.status` goes out when no connection is held anywhere.

It starts on the event loop of the instance's first request or connection (Daphne has no
start-up hook; a load balancer's health probe is usually first) and runs as long as that loop.
Its database work runs on its own thread (one: on SQLite two would wait on each other's write
lock, sleeping in its busy handler), never on the thread Channels' other database
calls share, so a slow receiver or a busy outbox never holds up a connect or a message; its
HTTP goes through its own client with RELAY_WEBHOOK_TIMEOUT_MS per attempt.
"""

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from relay.logging import Event, log_event
from webhooks import delivery, events, metrics, stream

logger = logging.getLogger("webhooks")

EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhooks-db")
# The longest a stopping instance spends recording outcomes and handing its leased rows back.
STOP_S = 3.0
# The longest a row that came due (a retry, a dead instance's lapsed lease) waits to be noticed;
# rows written on this instance wake the worker at once.
POLL_S = 1.0


def on_webhook_threads(func: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """`func` run on the worker's own database threads (with Django's connection care)."""
    return database_sync_to_async(func, thread_sensitive=False, executor=EXECUTOR)


def listening_environments() -> frozenset[str]:
    """The environments with an enabled endpoint."""
    from webhooks.models import Endpoint

    return frozenset(str(e) for e in Endpoint.objects.filter(enabled=True).values_list("environment_id", flat=True))


def write_stream_rows(rows: list[tuple]) -> None:
    """Write the Delivery rows of presence events (environment, type, timestamp, data, webhook id)."""
    from webhooks.models import Delivery, Endpoint

    environments = {row[0] for row in rows}
    endpoints: dict[str, list] = {}
    for endpoint in Endpoint.objects.filter(environment_id__in=environments, enabled=True):
        endpoints.setdefault(str(endpoint.environment_id), []).append(endpoint)
    made = []
    now = timezone.now()
    for environment_id, event_type, timestamp, data, webhook_id in rows:
        body = events.envelope(event_type, timestamp, data)
        for endpoint in endpoints.get(environment_id, ()):
            if endpoint.wants(event_type):
                made.append(
                    Delivery(
                        endpoint=endpoint,
                        webhook_id=webhook_id,
                        event_type=event_type,
                        body=body,
                        created_at=now,
                        next_attempt_at=now,
                    )
                )
    if made:
        with transaction.atomic():
            Delivery.objects.bulk_create(made, ignore_conflicts=True, batch_size=500)


class Worker:
    """The consumer, the deliverer and the known-environments refresh of one event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        self.wanted = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        # Rows leased per endpoint (queued or being sent), and each endpoint's sending slots.
        self.in_flight: dict[str, int] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}
        # Rows this instance leased and has not recorded yet, and their attempts' tasks.
        self.leased: set[int] = set()
        self.attempts: set[asyncio.Task] = set()
        self.outcomes: list[delivery.Outcome] = []
        self.recorded = asyncio.Event()
        self.client = delivery.new_client()
        self.consumer = stream.Consumer(on_webhook_threads(write_stream_rows))

    def start(self) -> None:
        for name, work in (
            ("environments", self._refresh_environments),
            ("stream", self._consume),
            ("delivery", self._deliver),
            ("record", self._record),
            ("expiries", self._expire_statuses),
        ):
            self.tasks.append(self.loop.create_task(work(), name=f"webhooks.{name}"))

    def wake(self) -> None:
        """Look for due rows now (called from any thread)."""
        self.loop.call_soon_threadsafe(self.wanted.set)

    async def _refresh_environments(self) -> None:
        read = on_webhook_threads(listening_environments)
        while not self.stopping.is_set():
            try:
                stream.known.ids = await read()
                metrics.ENVIRONMENTS.set(len(stream.known.ids))
            except Exception as error:
                log_event(logger, Event.WEBHOOK_ENVIRONMENTS_FAILED, logging.ERROR, error=type(error).__name__)
            await self._pause(stream.REFRESH_ENVIRONMENTS_S)

    async def _expire_statuses(self) -> None:
        # Presence sweeps passed status expiries only while this instance holds connections (it
        # has watchers to tell); a listening backend is told of one though nobody is connected.
        # Sweeps running at once are safe: each expiry is claimed by one (presence/status.py).
        from presence.status import expire_due
        from presence.store import record_failure

        while not self.stopping.is_set():
            if stream.known.ids:
                try:
                    await expire_due()
                except Exception as error:
                    record_failure("status_expiry", error)
            await self._pause(settings.RELAY_PRESENCE_REFRESH_MS / 1000)

    async def _consume(self) -> None:
        async def written(rows: list[tuple]) -> None:
            await on_webhook_threads(write_stream_rows)(rows)
            if rows:
                self.wanted.set()

        self.consumer.write_rows = written
        await stream.run_consumer(self.consumer, self.stopping)

    async def _deliver(self) -> None:
        claim = on_webhook_threads(delivery.claim)
        while not self.stopping.is_set():
            self.wanted.clear()
            saturated = {e for e, n in self.in_flight.items() if n >= delivery.LEASED_PER_ENDPOINT}
            free = {e: delivery.LEASED_PER_ENDPOINT - n for e, n in self.in_flight.items()}
            try:
                rows = await claim(free, saturated)
            except Exception as error:
                log_event(logger, Event.WEBHOOK_CLAIM_FAILED, logging.ERROR, error=type(error).__name__)
                rows = []
            for row in rows:
                self.in_flight[row.endpoint_id] = self.in_flight.get(row.endpoint_id, 0) + 1
                self.leased.add(row.id)
                task = self.loop.create_task(self._attempt(row))
                self.attempts.add(task)
                task.add_done_callback(self.attempts.discard)
            if len(rows) < delivery.CLAIM_BATCH:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wanted.wait(), POLL_S)

    async def _attempt(self, row: delivery.Claimed) -> None:
        slots = self.slots.get(row.endpoint_id)
        if slots is None:
            slots = self.slots[row.endpoint_id] = asyncio.Semaphore(delivery.PER_ENDPOINT)
        try:
            async with slots:
                await self._send(row)
        finally:
            left = self.in_flight.get(row.endpoint_id, 1) - 1
            if left:
                self.in_flight[row.endpoint_id] = left
            else:
                self.in_flight.pop(row.endpoint_id, None)
                self.slots.pop(row.endpoint_id, None)
            if left <= delivery.LEASED_PER_ENDPOINT // 2:
                # Room for many more of its endpoint's rows: one lease round trip feeds them all.
                self.wanted.set()

    async def _send(self, row: delivery.Claimed) -> None:
        outcome = await delivery.attempt(self.client, row)
        self.outcomes.append(outcome)
        self.recorded.set()

    async def _record(self) -> None:
        record = on_webhook_threads(delivery.record)
        while not self.stopping.is_set() or self.outcomes:
            if not self.outcomes:
                self.recorded.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.recorded.wait(), POLL_S)
                continue
            batch, self.outcomes = self.outcomes, []
            try:
                await record(batch)
                self.leased.difference_update(outcome.claimed.id for outcome in batch)
            except Exception as error:
                # Unrecorded attempts are retried when their lease lapses (same webhook-id).
                log_event(logger, Event.WEBHOOK_RECORD_FAILED, logging.ERROR, error=type(error).__name__)
                await self._pause(POLL_S)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def stop(self) -> None:
        """Stop at once: attempts in flight are abandoned and their rows handed back (not lost:
        another instance sends them, with the same webhook-id), outcomes already known recorded."""
        self.stopping.set()
        for task in (*self.tasks, *self.attempts):
            task.cancel()
        await asyncio.gather(*self.tasks, *self.attempts, return_exceptions=True)
        try:
            async with asyncio.timeout(STOP_S):
                if self.outcomes:
                    batch, self.outcomes = self.outcomes, []
                    await on_webhook_threads(delivery.record)(batch)
                    self.leased.difference_update(outcome.claimed.id for outcome in batch)
                if self.leased:
                    await on_webhook_threads(delivery.release)(sorted(self.leased))
        except Exception as error:
            # Their leases lapse instead: later, never lost.
            log_event(logger, Event.WEBHOOK_RELEASE_FAILED, logging.ERROR, error=type(error).__name__)
        await self.client.close()
        await self.consumer.close()


_worker: Worker | None = None


def ensure_started() -> None:
    """Start this process's worker on the running loop, once (unless settings switch it off)."""
    global _worker
    if _worker is not None or not settings.RELAY_WEBHOOK_WORKER:
        return
    _worker = Worker()
    _worker.start()


def stop_on_shutdown() -> None:
    """Stop this process's worker when Daphne shuts down (its reactor's "before shutdown")."""
    if "twisted.internet.reactor" not in sys.modules:
        return
    from twisted.internet import reactor

    reactor.addSystemEventTrigger("before", "shutdown", _stop)


def _stop() -> object:
    from twisted.internet import defer

    if _worker is None:
        return None
    return defer.Deferred.fromFuture(asyncio.ensure_future(_worker.stop()))


def wake() -> None:
    """Tell this process's worker that rows were written (after a commit, from any thread)."""
    if _worker is not None:
        _worker.wake()


class StartWorker:
    """ASGI middleware: starts the webhook worker at the process's first request or connection."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if _worker is None and scope["type"] in ("http", "websocket"):
            ensure_started()
        await self.app(scope, receive, send)
