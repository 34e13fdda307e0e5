"""Each instance's reconciliation of its live connections with what is true now, every refresh interval.

Revocations and membership changes reach the instances first as pub/sub notices (the fast path),
and pub/sub drops messages while a subscriber reconnects. So every RELAY_PRESENCE_REFRESH_MS each
instance also checks its open connections against the durable truth (the slow path, which
nothing can drop):

- a connection whose environment's signing secret is no longer the one its token was verified
  with is closed with 4401 (and this process forgets the secret it cached);
- a connection whose user's membership version (a Redis counter every change bumps, after its
  commit) is not the one it last saw re-reads its channels and applies the difference. A new
  connection has seen none, so its first round re-reads once: a change whose notice was lost
  while it connected is caught too.

A rotation's notice makes the instance reconcile at once instead of at the next interval.
"""

import asyncio
import hashlib
import logging
import weakref
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction

from relay import membership, tokens
from relay.layer import channel_layer
from relay.logging import Event, log_event
from relay.models import Environment
from relay.queries import channel_ids_of_users
from relay.redis_clients import async_client

logger = logging.getLogger(__name__)

SECRETS_GROUP = "secrets"
REVOKE = "connection.revoke"
SYNC = "membership.sync"
# A connection that has not yet compared its user's membership version with Redis's.
UNSEEN = object()


def secret_version(environment: Environment) -> str:
    """A fingerprint of the environment's signing secret: equal while the secret is the same."""
    return hashlib.sha256(environment.signing_secret.encode()).hexdigest()[:16]


def rotate_secret(environment: Environment) -> None:
    """Rotate the environment's token secret and tell every instance to close its connections (4401).

    Told after the commit; an instance that misses the notice closes them at its next round.
    """
    tokens.rotate_signing_secret(environment)
    transaction.on_commit(lambda: _announce_rotation(str(environment.id)))


def _announce_rotation(environment_id: str) -> None:
    try:
        async_to_sync(channel_layer().group_send)(
            SECRETS_GROUP, {"type": "secret.rotated", "environment": environment_id}
        )
    except Exception as error:
        # The rotation stands; each instance's next round closes the connections.
        log_event(logger, Event.RECONCILE_NOTIFY_FAILED, logging.ERROR, error=type(error).__name__)


class Reconciler:
    """This event loop's open connections, reconciled every refresh interval while there are any."""

    def __init__(self) -> None:
        self.layer = channel_layer()
        self.connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._redis = None
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task | None = None
        self._again = False
        self._joined: asyncio.Task | None = None

    async def start(self) -> None:
        """Join the secrets group once for this loop (rotation notices); later calls return at once."""
        joined = self._joined
        if joined is None or (joined.done() and (joined.cancelled() or joined.exception() is not None)):
            joined = self._joined = asyncio.ensure_future(self.layer.route_group(SECRETS_GROUP, self.notice_received))
        await asyncio.shield(joined)

    def add(self, conn: Any) -> None:
        """Reconcile `conn` from now on, until `discard`."""
        conn.membership_version = UNSEEN
        self.connections.add(conn)
        if self._timer is None and self._running is None:
            self._schedule()

    def discard(self, conn: Any) -> None:
        """Stop reconciling `conn` (it ended)."""
        self.connections.discard(conn)

    def notice_received(self, message: dict) -> None:
        """A rotation announced by another process: forget the cached secret and reconcile now."""
        environment_id = message.get("environment")
        if isinstance(environment_id, str):
            tokens.forget_environment(environment_id)
        self.run_soon()

    def run_soon(self) -> None:
        """Reconcile now, or right after the round in progress."""
        if self._running is not None:
            self._again = True
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._running = asyncio.ensure_future(self._round())

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        # A timer rather than a sleeping task: a loop that ends (each in-process test's) leaves no
        # pending task behind, and with no connections nothing runs at all.
        self._timer = loop.call_later(settings.RELAY_PRESENCE_REFRESH_MS / 1000, self._due)

    def _due(self) -> None:
        self._timer = None
        self._running = asyncio.ensure_future(self._round())

    async def _round(self) -> None:
        try:
            await self.reconcile()
        except Exception as error:
            log_event(logger, Event.RECONCILE_FAILED, logging.ERROR, op="round", error=type(error).__name__)
        finally:
            self._running = None
            if self._again:
                self._again = False
                self.run_soon()
            elif self.connections:
                self._schedule()

    async def reconcile(self) -> None:
        """One round over every open connection: revoked secrets, then membership versions."""
        connections = [conn for conn in list(self.connections) if not conn.ended]
        if not connections:
            return
        await self._check_secrets(connections)
        await self._check_memberships([conn for conn in connections if not conn.revoked])

    async def _check_secrets(self, connections: list[Any]) -> None:
        environment_ids = {conn.environment_id for conn in connections}
        current = await database_sync_to_async(_secret_versions)(environment_ids)
        for conn in connections:
            if current.get(conn.environment_id) != conn.secret_version:
                tokens.forget_environment(conn.environment_id)
                conn.revoked = True
                self.layer.send_local(conn.channel_name, {"type": REVOKE})

    async def _check_memberships(self, connections: list[Any]) -> None:
        if not connections:
            return
        user_pks = sorted({conn.user.pk for conn in connections})
        try:
            if self._redis is None:
                self._redis = async_client(settings.RELAY_REDIS_URL)
            found = await self._redis.mget([membership.version_key(pk) for pk in user_pks])
            versions = dict(zip(user_pks, found, strict=True))
        except Exception as error:
            # Redis away: the notices are not flowing either; the next round tries again.
            log_event(logger, Event.RECONCILE_FAILED, logging.ERROR, op="versions", error=type(error).__name__)
            return
        stale = [conn for conn in connections if conn.membership_version != versions[conn.user.pk]]
        if not stale:
            return
        # Read AFTER the versions: what is read is at least as new as each version seen, and a
        # change committed later bumps its user's version again for the next round.
        channels = await database_sync_to_async(channel_ids_of_users)({conn.user.pk for conn in stale})
        for conn in stale:
            conn.membership_version = versions[conn.user.pk]
            found = channels.get(conn.user.pk, set())
            if found != conn.channel_ids:
                self.layer.send_local(conn.channel_name, {"type": SYNC, "channels": sorted(found)})


def _secret_versions(environment_ids: set[str]) -> dict[str, str]:
    """Each existing environment's `secret_version`, by id (a deleted one is absent)."""
    return {
        str(environment.id): secret_version(environment)
        for environment in Environment.objects.filter(id__in=environment_ids).only("id", "signing_secret")
    }


_reconcilers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Reconciler]" = weakref.WeakKeyDictionary()


def reconciler() -> Reconciler:
    """The reconciler of the running event loop (Daphne runs one; each in-process test its own)."""
    loop = asyncio.get_running_loop()
    found = _reconcilers.get(loop)
    if found is None:
        found = _reconcilers[loop] = Reconciler()
    return found
