"""What one reconciliation round costs an instance holding 10,000 connections (docs/scaling.md).

    .venv/bin/python scripts/measure_reconcile.py
    scripts/with-postgres .venv/bin/python scripts/measure_reconcile.py

Builds 10,000 users in 10 channels each in a throwaway database (a temporary SQLite file, or
the DATABASE_URL given), then times relay.reconcile's round over one open connection per user:
the steady state (every version unchanged: one versions query), and the worst case (every
version moved: the versions, then every user's channels, and a sync per connection). Prints
the median wall time and the process CPU time of a round.
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
_scratch = tempfile.TemporaryDirectory(prefix="relay-reconcile-")
os.environ.setdefault("DATABASE_URL", f"sqlite:///{_scratch.name}/measure.sqlite3")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
os.environ.setdefault("DEBUG", "1")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import F  # noqa: E402

from relay import reconcile  # noqa: E402
from relay.models import Channel, Environment, Membership, User  # noqa: E402

CONNECTIONS = 10_000
CHANNELS = 10
ROUNDS = 7


class Conn:
    """What a round reads of a connection (a consumer's attributes of the same names)."""

    def __init__(self, **attributes: object) -> None:
        self.__dict__.update(attributes)


class Layer:
    """Counts what a round hands the connections, instead of queuing it."""

    def __init__(self) -> None:
        self.sent = 0

    def send_local(self, channel: str, message: dict) -> bool:
        self.sent += 1
        return True


def build() -> list[Conn]:
    call_command("migrate", verbosity=0)
    environment = Environment.objects.create(name="measure")
    channels = Channel.objects.bulk_create(
        Channel(environment=environment, name=f"c-{i}") for i in range(CONNECTIONS // 100)
    )
    users = User.objects.bulk_create(User(environment=environment, external_id=f"u-{i}") for i in range(CONNECTIONS))
    Membership.objects.bulk_create(
        Membership(user=user, channel=channels[(i + k * 7) % len(channels)])
        for i, user in enumerate(users)
        for k in range(CHANNELS)
    )
    secret = reconcile.secret_version(environment)
    return [
        Conn(
            user=user,
            environment_id=str(environment.id),
            secret_version=secret,
            channel_name=f"conn-{i}",
            channel_ids=set(),
            membership_version=0,
            ended=False,
            revoked=False,
        )
        for i, user in enumerate(users)
    ]


async def timed(reconciler: reconcile.Reconciler, before: object = None) -> tuple[float, float]:
    if before is not None:
        await asyncio.to_thread(before)
    wall, cpu = time.perf_counter(), time.process_time()
    await reconciler.reconcile()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def moved() -> None:
    User.objects.update(membership_version=F("membership_version") + 1)
    connection.close()


async def main() -> None:
    conns = await asyncio.to_thread(build)
    reconciler = reconcile.Reconciler()
    layer = reconciler.layer = Layer()
    for conn in conns:
        reconciler.connections.add(conn)
    await reconciler.reconcile()  # every connection's first round reads once
    steady = [await timed(reconciler) for _ in range(ROUNDS)]
    layer.sent = 0
    worst = [await timed(reconciler, moved) for _ in range(ROUNDS)]
    print(f"database: {connection.vendor}; {CONNECTIONS} connections, {CHANNELS} channels each")
    for name, runs in (("steady state (no version moved)", steady), ("every version moved", worst)):
        wall = statistics.median(run[0] for run in runs)
        cpu = statistics.median(run[1] for run in runs)
        print(f"{name}: a round takes {wall:.1f} ms wall, {cpu:.1f} ms CPU (median of {ROUNDS})")
    print(f"syncs handed to connections in the moved rounds: {layer.sent // ROUNDS} a round")


asyncio.run(main())
