"""relay_client's rich presence against real instances: status, idle, last seen, invisibility."""

import asyncio

import pytest
from channels.db import database_sync_to_async
from relay_client import Client, FrameRefused, PresenceChanged, PresenceStatus

from tests.support import Instance, http, timings, until

pytestmark = pytest.mark.live

FAST = {"retry_base": 0.1, "retry_cap": 1.0}


def base(instance: Instance) -> str:
    return f"ws://127.0.0.1:{instance.port}"


async def client(instance: Instance, tenant, user_id: str, **options) -> Client:
    token = await database_sync_to_async(tenant.token)(user_id)
    opened = Client(base(instance), token, **FAST, **options)
    await opened.connect()
    return opened


async def test_status_idle_and_query_through_the_client(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await client(a, acme, "linh")
    tuan = await client(b, acme, "tuan", device="mobile")
    await until(lambda: "tuan" in linh.online)
    own = await tuan.set_status(status="busy", text="in a meeting")
    assert isinstance(own, PresenceStatus) and own.invisible is False and tuan.own_status == own
    await until(lambda: linh.statuses.get("tuan", {}).get("status") == "busy")
    await tuan.set_idle(True)
    await until(lambda: linh.statuses["tuan"]["idle"] is True)
    answer = await linh.query(["tuan", "hermit"])
    assert set(answer) == {"tuan"} and answer["tuan"]["state"] == "online" and answer["tuan"]["idle"] is True
    status, body = http("GET", f"{a.http_url}/v1/users/tuan/presence", api_key=acme.api_key)
    assert status == 200 and body["connections"][0]["device"] == "mobile"
    await linh.close()
    await tuan.close()


async def test_idle_is_said_again_after_a_reconnect(live_instances, acme):
    a, b = live_instances(2, **timings())
    linh = await client(a, acme, "linh")
    tuan = await client(b, acme, "tuan")
    await tuan.set_idle(True)
    await until(lambda: linh.statuses.get("tuan", {}).get("idle") is True)
    first = tuan.connection_id
    b.stop()
    b.start()
    # The client reconnects on its own; its new connection starts active and is told idle again.
    await until(lambda: tuan.connected and tuan.connection_id != first)

    def connections() -> list[dict]:
        return http("GET", f"{a.http_url}/v1/users/tuan/presence", api_key=acme.api_key)[1]["connections"]

    await until(lambda: [c["idle"] for c in connections()] == [True])
    assert tuan.idle is True
    await linh.close()
    await tuan.close()


async def test_invisibility_and_refusals_through_the_client(live_instances, acme):
    (a,) = live_instances(1, **timings())
    linh = await client(a, acme, "linh")
    tuan = await client(a, acme, "tuan")
    events: list = []

    async def collect() -> None:
        async for event in linh:
            events.append(event)

    reader = asyncio.create_task(collect())
    await until(lambda: "tuan" in linh.online)
    await tuan.set_status(invisible=True)
    assert tuan.invisible is True
    await until(lambda: "tuan" not in linh.online)
    assert PresenceChanged(user="tuan", state="offline") in events
    http("PATCH", f"{a.http_url}/v1/settings", {"allow_invisible": False}, acme.api_key)
    await tuan.set_status(invisible=False)
    await until(lambda: "tuan" in linh.online)
    with pytest.raises(FrameRefused) as refused:
        await tuan.set_status(invisible=True)
    assert refused.value.error.code == "forbidden"
    assert tuan.invisible is False
    reader.cancel()
    await linh.close()
    await tuan.close()
