"""Each instance's reconciliation of its live connections with what is true now, every refresh interval.

Revocations and membership changes reach the instances first as pub/sub notices (the fast path),
and pub/sub drops messages while a subscriber reconnects. So every RELAY_PRESENCE_REFRESH_MS each
instance also checks its open connections against the durable truth (the slow path, which
nothing can drop):

- a connection whose environment's signing secret is no longer the one its token was verified
  with is closed with 4401 (and this process forgets the secret it cached);
- a connection whose user's membership version (a column every change bumps in its own
  transaction) is not the one it last saw re-reads its channels, with the version they are at,
  and applies the difference. A new connection has seen none, so its first round re-reads once:
  a change whose notice was lost while it connected is caught too.

Its cost is one query per round for the versions of every connected user (by primary key, in
chunks), and a read of the channels of those whose version moved: docs/scaling.md gives the
measured numbers.

A rotation's notice makes the instance reconcile at once instead of at the next interval.
"""

import hashlib
import logging
import weakref
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction

from relay import tokens
from relay.clock import Clock, LoopClock, Periodic
from relay.layer import channel_layer, publish_notice
from relay.logging import Event, log_event
from relay.loops import PerLoop, SharedOnce
from relay.models import Environment
from relay.queries import membership_versions, versioned_channel_ids

logger = logging.getLogger(__name__)

# When the rounds run (relay/clock.py); tests replace it to run a round without sleeping.
clock: Clock = LoopClock()

SECRETS_GROUP = "secrets"
REVOKE = "connection.revoke"
SYNC = "membership.sync"
# A connection that has not yet compared its user's membership version with the database's.
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
        publish_notice(SECRETS_GROUP, {"type": "secret.rotated", "environment": environment_id})
    except Exception as error:
        # The rotation stands; each instance's next round closes the connections.
        log_event(logger, Event.RECONCILE_NOTIFY_FAILED, logging.ERROR, error=type(error).__name__)


class Reconciler:
    """This event loop's open connections, reconciled every refresh interval while there are any."""

    def __init__(self) -> None:
        self.layer = channel_layer()
        self.connections: weakref.WeakSet[Any] = weakref.WeakSet()
        # Joined once for this loop (rotation notices); later calls return at once.
        self.start = SharedOnce(lambda: self.layer.route_group(SECRETS_GROUP, self.notice_received))
        self.rounds = Periodic(
            self.reconcile,
            interval=lambda: settings.RELAY_PRESENCE_REFRESH_MS / 1000,
            clock=lambda: clock,
            failed=_round_failed,
            wanted=lambda: bool(self.connections),
        )

    def add(self, conn: Any) -> None:
        """Reconcile `conn` from now on, until `discard`."""
        conn.membership_version = UNSEEN
        self.connections.add(conn)
        self.rounds.start()

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
        self.rounds.run_soon()

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
        user_pks = {conn.user.pk for conn in connections}
        # The durable versions, not a copy in Redis: a change whose notice and everything else
        # after its commit was lost (a Redis outage, a process that died) still moved this.
        versions = await read_versions(user_pks)
        stale = {conn.user.pk for conn in connections if conn.membership_version != versions.get(conn.user.pk)}
        if not stale:
            return
        found = await read_versioned_channels(stale)
        for conn in connections:
            if conn.user.pk in found:
                version, channels = found[conn.user.pk]
                conn.membership_version = version
                # Always sent: the connection orders it against the notices it has applied
                # (relay.membership.Applied), and only it knows whether it changes anything.
                sync = {"type": SYNC, "channels": sorted(channels), "version": version}
                self.layer.send_local(conn.channel_name, sync)


# Off the thread every other database call shares: a round over thousands of connections must not
# hold up the connects and sends queued behind it.
read_versions = database_sync_to_async(membership_versions, thread_sensitive=False)
read_versioned_channels = database_sync_to_async(versioned_channel_ids, thread_sensitive=False)


def _secret_versions(environment_ids: set[str]) -> dict[str, str]:
    """Each existing environment's `secret_version`, by id (a deleted one is absent)."""
    return {
        str(environment.id): secret_version(environment)
        for environment in Environment.objects.filter(id__in=environment_ids).only("id", "signing_secret")
    }


def _round_failed(error: Exception) -> None:
    log_event(logger, Event.RECONCILE_FAILED, logging.ERROR, op="round", error=type(error).__name__)


# The reconciler of the running event loop.
reconciler = PerLoop(Reconciler)
