"""Delivering due rows: lease, sign, POST, record; on every running instance, isolated from the rest.

A row is leased with an UPDATE that only succeeds while it is pending and due (so two instances
never both send an attempt, on SQLite and PostgreSQL alike), for longer than an attempt can
take: an instance killed mid-attempt leaves the row to be retried, with the same webhook-id,
when the lease ends. Each endpoint has at most PER_ENDPOINT attempts in flight on an instance
and LEASED_PER_ENDPOINT rows leased (sent as slots free up: one lease round trip feeds several
attempts), and rows are only leased for endpoints below that, so a receiver that hangs holds its
own rows and nothing else. All of this runs in the webhook worker's own tasks, with its database
work on its own threads (webhooks.worker): presence and messages never wait for it.
"""

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import aiohttp
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from relay.logging import Event, log_event
from webhooks import addresses, metrics, signing
from webhooks.models import Delivery, Endpoint

logger = logging.getLogger("webhooks")

PER_ENDPOINT = 16
LEASED_PER_ENDPOINT = 16 * PER_ENDPOINT
CLAIM_BATCH = 500
# No single wait between retries is longer than this, however many attempts failed.
MAX_BACKOFF_S = 3600
MAX_ERROR_LENGTH = 200


@dataclass(frozen=True)
class Claimed:
    """One leased row, with what its attempt needs."""

    id: int
    endpoint_id: int
    url: str
    secret: str
    webhook_id: str
    body: str
    attempts: int
    created_at: datetime


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to."""

    claimed: Claimed
    status_code: int | None
    error: str
    latency_ms: int


def backoff_seconds(attempts: int) -> float:
    """The wait after `attempts` failed attempts: doubling from RELAY_WEBHOOK_BACKOFF_MS, with jitter."""
    base = settings.RELAY_WEBHOOK_BACKOFF_MS / 1000 * 2 ** max(attempts - 1, 0)
    # Jitter spreads the retries of many rows that failed together (a receiver that was down).
    return min(base, MAX_BACKOFF_S) * random.uniform(0.75, 1.25)


def lease_seconds() -> float:
    """How long a leased row stays taken: longer than every attempt ahead of it on its endpoint can
    take, so only a dead instance's lease lapses."""
    waves = LEASED_PER_ENDPOINT // PER_ENDPOINT
    return settings.RELAY_WEBHOOK_TIMEOUT_MS / 1000 * (waves + 1) + 10


def claim(free: dict[int, int], saturated: set[int], limit: int = CLAIM_BATCH) -> list[Claimed]:
    """Lease due rows, at most `free[endpoint]` (else LEASED_PER_ENDPOINT) per endpoint, none of `saturated`."""
    now = timezone.now()
    due = (
        Delivery.objects.filter(status=Delivery.PENDING, next_attempt_at__lte=now, endpoint__enabled=True)
        .exclude(endpoint_id__in=saturated)
        .order_by("next_attempt_at", "id")
        .values_list("id", "endpoint_id")[: limit * 2]
    )
    picked: list[int] = []
    taken: dict[int, int] = {}
    for row_id, endpoint_id in due:
        if taken.get(endpoint_id, 0) < free.get(endpoint_id, LEASED_PER_ENDPOINT) and len(picked) < limit:
            taken[endpoint_id] = taken.get(endpoint_id, 0) + 1
            picked.append(row_id)
    if not picked:
        return []
    token = uuid.uuid4().hex
    Delivery.objects.filter(id__in=picked, status=Delivery.PENDING, next_attempt_at__lte=now).update(
        lease=token, next_attempt_at=now + timedelta(seconds=lease_seconds())
    )
    rows = Delivery.objects.filter(id__in=picked, lease=token).select_related("endpoint")
    return [
        Claimed(
            id=row.id,
            endpoint_id=row.endpoint_id,
            url=row.endpoint.url,
            secret=row.endpoint.secret,
            webhook_id=row.webhook_id,
            body=row.body,
            attempts=row.attempts,
            created_at=row.created_at,
        )
        for row in rows
    ]


def release(row_ids: list[int]) -> int:
    """Hand leased rows back, due now, for any instance to send (a stopping instance's)."""
    return Delivery.objects.filter(id__in=row_ids, status=Delivery.PENDING).update(
        lease="", next_attempt_at=timezone.now()
    )


def record(outcomes: list[Outcome]) -> None:
    """Write the attempts' outcomes in one transaction; a 410 disables its endpoint and its backlog."""
    now = timezone.now()
    changed: list[Delivery] = []
    gone: set[int] = set()
    for outcome in outcomes:
        claimed = outcome.claimed
        row = Delivery(
            id=claimed.id,
            attempts=claimed.attempts + 1,
            last_status_code=outcome.status_code,
            last_error=outcome.error,
            last_latency_ms=outcome.latency_ms,
            lease="",
            delivered_at=None,
            next_attempt_at=now,
        )
        code = outcome.status_code
        if code is not None and 200 <= code < 300:
            row.status, row.delivered_at = Delivery.DELIVERED, now
        elif code == 410:
            row.status = Delivery.DISABLED
            gone.add(claimed.endpoint_id)
        else:
            wait = backoff_seconds(claimed.attempts + 1)
            retry_until = claimed.created_at + timedelta(seconds=settings.RELAY_WEBHOOK_RETRY_S)
            if now + timedelta(seconds=wait) > retry_until:
                row.status = Delivery.FAILED
            else:
                row.status, row.next_attempt_at = Delivery.PENDING, now + timedelta(seconds=wait)
        changed.append(row)
    fields = [
        "attempts",
        "last_status_code",
        "last_error",
        "last_latency_ms",
        "lease",
        "status",
        "delivered_at",
        "next_attempt_at",
    ]
    with transaction.atomic():
        _update_each(changed, fields)
        if gone:
            Endpoint.objects.filter(id__in=gone, enabled=True).update(enabled=False, disabled_at=now)
            Delivery.objects.filter(endpoint_id__in=gone, status=Delivery.PENDING).update(
                status=Delivery.DISABLED, lease=""
            )
    for outcome, row in zip(outcomes, changed, strict=True):
        _report(outcome, row.status)


def _update_each(rows: list[Delivery], fields: list[str]) -> None:
    """One prepared UPDATE per row, sent with executemany: bulk_update's CASE per field and row
    cost tens of milliseconds a batch in Python, this a fraction of one."""
    meta = Delivery._meta
    columns = [meta.get_field(name) for name in fields]
    table = connection.ops.quote_name(meta.db_table)
    assignments = ", ".join(f"{connection.ops.quote_name(field.column)} = %s" for field in columns)
    sql = f"UPDATE {table} SET {assignments} WHERE {connection.ops.quote_name(meta.pk.column)} = %s"
    params = [
        [field.get_db_prep_save(getattr(row, field.attname), connection) for field in columns] + [row.pk]
        for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _report(outcome: Outcome, status: str) -> None:
    endpoint_id = outcome.claimed.endpoint_id
    attempt = outcome.claimed.attempts + 1
    if status == Delivery.DELIVERED:
        metrics.DELIVERIES.labels(outcome="delivered").inc()
        log_event(
            logger,
            Event.WEBHOOK_DELIVERED,
            endpoint=endpoint_id,
            status=outcome.status_code,
            attempt=attempt,
            latency_ms=outcome.latency_ms,
        )
        return
    label = {Delivery.PENDING: "retry", Delivery.FAILED: "failed", Delivery.DISABLED: "disabled"}[status]
    metrics.DELIVERIES.labels(outcome=label).inc()
    log_event(
        logger,
        Event.WEBHOOK_FAILED,
        logging.WARNING,
        endpoint=endpoint_id,
        status=outcome.status_code,
        error=outcome.error,
        attempt=attempt,
        outcome=label,
    )


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


# What is read of a receiver's answer: enough to reuse the connection, never the body's worth.
MAX_ANSWER_BYTES = 64 * 1024


def new_client() -> aiohttp.ClientSession:
    """The delivery client: it connects only to addresses its resolver checked (webhooks/addresses.py)."""
    # aiohttp rather than httpx: its pool kept eight concurrent requests to one receiver at a
    # hundred a second on this machine (bench/webhooks.py), aiohttp at thousands.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, resolver=addresses.PublicResolver()),
        timeout=aiohttp.ClientTimeout(total=settings.RELAY_WEBHOOK_TIMEOUT_MS / 1000),
        # Cookies a receiver sets are never sent back, to it or to another tenant's endpoint.
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        auto_decompress=False,
    )


async def attempt(client: aiohttp.ClientSession, claimed: Claimed) -> Outcome:
    """POST one row's event to its endpoint (made by `new_client`), signed; never raises."""
    started = time.perf_counter()
    status_code: int | None = None
    error = ""
    try:
        # An address in the URL is connected to without a lookup: checked here. A name is checked
        # by the client's resolver, as the connection resolves it.
        addresses.check_literal(claimed.url)
        headers = signing.signed_headers(claimed.secret, claimed.webhook_id, claimed.body)
        # The whole attempt, not each read: a receiver trickling bytes must not hold it longer.
        async with (
            asyncio.timeout(settings.RELAY_WEBHOOK_TIMEOUT_MS / 1000),
            client.post(claimed.url, data=claimed.body.encode(), headers=headers, allow_redirects=False) as response,
        ):
            status_code = response.status
            await response.content.read(MAX_ANSWER_BYTES)
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}"
    except addresses.RefusedUrl as refused:
        error = _short(str(refused))
    except TimeoutError:
        error = "timeout"
    except (aiohttp.ClientError, ValueError) as failed:
        cause = getattr(failed, "os_error", None)
        # The exception's class, not its text: some carry the URL, whose query may hold a secret.
        error = _short(str(cause) if isinstance(cause, addresses.RefusedAddress) else type(failed).__name__)
    latency = time.perf_counter() - started
    metrics.ATTEMPT_SECONDS.observe(latency)
    return Outcome(claimed=claimed, status_code=status_code, error=error, latency_ms=int(latency * 1000))
