"""Nothing lost to a Redis fault, across real Daphne processes on a private Redis that stops and returns.

docs/contract.md, "Convergence": after Redis returns from any outage, every connection's channels
equal the database's within two refresh intervals, and no subscription is lost to the outage.
In acme, linh and tuan share "fleet" (private) and "general".
"""

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

from devtools.embedded_redis import EmbeddedRedis
from tests.chat_helpers import send_payload
from tests.support import BASE_DIR, WAIT, WsClient, connect, http, logged, timings

pytestmark = pytest.mark.live

# No reconciliation round falls inside a test: only a notice can deliver a change in time.
SLOW_ROUNDS = timings(ttl=180_000, refresh=60_000)


@pytest.fixture
def private_redis() -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own, which it may stop and start again (empty) on the same port."""
    server = EmbeddedRedis().start()
    yield server
    server.close()


def message_ids(client: WsClient) -> list[str]:
    return [message["id"] for message in client.of_type("message.created")]


async def hears(client: WsClient, message: dict) -> None:
    await client.wait_for(lambda c: message["payload"]["id"] in message_ids(c))


async def test_a_process_that_starts_during_an_outage_subscribes_once_redis_returns(
    live_instances, acme, private_redis
):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    private_redis.stop()
    (late,) = live_instances(1, RELAY_REDIS_URL=private_redis.url, **SLOW_ROUNDS)
    # linh connects while Redis is away: her instance's inbox, membership bus, rotation notices
    # and her channels' groups all fail to subscribe, and are admitted all the same.
    linh = await WsClient.open(late.ws_url(acme.token("linh")))
    assert (await linh.next_of("connection.ack"))["user"] == "linh"
    private_redis.start()
    await logged(late, "layer.reconnected")
    (other,) = live_instances(1, RELAY_REDIS_URL=private_redis.url, **SLOW_ROUNDS)
    tuan = await connect(other, acme, "tuan")

    # Her channels' groups: she hears fleet.
    await hears(linh, await tuan.send_and_ack(send_payload(fleet, "after the outage")))

    # The membership bus: her removal from general reaches her at once (no round is due for a minute).
    status, _ = http("DELETE", f"{other.http_url}/v1/channels/{general.id}/members/linh", api_key=acme.api_key)
    assert status == 204
    gone = await tuan.send_and_ack(send_payload(general, "linh has left general"))
    barrier = await tuan.send_and_ack(send_payload(fleet, "linh is still in fleet"))
    await hears(linh, barrier)
    assert gone["payload"]["id"] not in message_ids(linh)

    # The rotation notices: a new secret closes her socket at once.
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "manage.py", "rotatesecret", "acme"],
        env=other.env,
        capture_output=True,
        cwd=BASE_DIR,
        timeout=60,
    )
    assert done.returncode == 0
    assert await linh.closed(WAIT) == 4401
    await tuan.close()
