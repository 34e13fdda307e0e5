"""Presence's Redis connections reset under load: every failure is a logged `presence.failed`, never a crash.

The presence Redis sits behind the chaos package's fault proxy (chaos/proxy.py), which resets
every connection through it at once, as a restarted load balancer or a dropped NAT entry would.
Under uvloop a write on a connection the reset already closed raises RuntimeError rather than a
ConnectionError; escaping, it ended grace checks with tracebacks (and their users' offline with
them). The race is narrow: eighty closes meet a reset every 5 ms.
"""

import asyncio
from urllib.parse import urlparse

import pytest
from asgiref.sync import sync_to_async

from chaos.deploy import Proxy
from relay.models import Membership, User
from tests.support import close_all, connect, heard, logged, timings

pytestmark = pytest.mark.live

USERS = 80


@sync_to_async
def add_users(tenant, count: int) -> list[str]:
    users = User.objects.bulk_create(
        [User(environment=tenant.environment, external_id=f"u-{i:03d}") for i in range(count)]
    )
    Membership.objects.bulk_create([Membership(channel=tenant.channels["general"], user=user) for user in users])
    return [user.external_id for user in users]


async def test_closes_racing_connection_resets_end_in_offlines_and_no_traceback(live_instances, acme, redis_url):
    proxy = Proxy(urlparse(redis_url).port)
    try:
        # Presence alone behind the proxy: its client's connections take the resets.
        [behind] = live_instances(1, **timings(grace=300, RELAY_PRESENCE_REDIS_URL=proxy.url))
        [watching] = live_instances(1, **timings(grace=300))
        users = await add_users(acme, USERS)
        linh = await connect(watching, acme, "linh")
        clients = [await connect(behind, acme, user) for user in users]
        for user in users:
            await heard(linh, user, 1)

        async def cut_repeatedly() -> None:
            for _ in range(300):
                await asyncio.to_thread(proxy.command, "cut")
                await asyncio.sleep(0.005)

        await asyncio.gather(cut_repeatedly(), *(client.close() for client in clients))

        # The closes went on: their grace checks decided, failed calls were logged as failures.
        await linh.wait_for(lambda client: any(change["state"] == "offline" for change in client.changes()))
        await logged(behind, "presence.failed")
        assert "Traceback" not in behind.log_path.read_text()
        await close_all(linh)
    finally:
        proxy.stop()
