"""The agent registry across real Daphne processes sharing one database and one Redis.

linh's workers reconnect to whichever instance the balancer picks; tuan is another
identity of the same tenant racing for the same instance ids.
"""

import asyncio

import pytest

from tests.support import WsClient, connect, http, until

pytestmark = pytest.mark.live


def agents_of(instance, tenant) -> dict[str, dict]:
    status, body = http("GET", f"{instance.http_url}/v1/agents", api_key=tenant.api_key)
    assert status == 200
    return {agent["instance"]: agent for agent in body["agents"]}


def replies_to_register(client: WsClient, after: int) -> list[dict]:
    return [frame for frame in client.frames[after:] if frame["type"] in ("register.ack", "error")]


async def test_re_registering_after_a_reconnect_to_another_instance_keeps_registered_at(live_instances, acme, closing):
    one, two = live_instances(2)
    first = await closing(connect(one, acme, "linh"))
    await first.send("register", {"instance": "w-1", "capability": {"host": "box-a", "weight": 1}})
    registered_at = (await first.next_of("register.ack"))["registered_at"]
    await first.close()
    # The disconnect removed nothing.
    assert agents_of(two, acme)["w-1"]["registered_at"] == registered_at

    second = await closing(connect(two, acme, "linh"))
    await second.send("register", {"instance": "w-1", "capability": {"host": "box-b"}})
    assert await second.next_of("register.ack") == {"instance": "w-1", "registered_at": registered_at}
    row = agents_of(one, acme)["w-1"]
    assert row["registered_at"] == registered_at
    assert row["last_seen"] > registered_at
    assert (row["identity"], row["capability"]) == ("linh", {"host": "box-b"})


async def test_two_identities_racing_for_one_instance_on_two_instances_leave_exactly_one_owner(
    live_instances, acme, closing
):
    one, two = live_instances(2)
    linh = await closing(connect(one, acme, "linh"))
    tuan = await closing(connect(two, acme, "tuan"))
    winners = []
    for round_number in range(6):
        instance = f"race-{round_number}"
        marks = (len(linh.frames), len(tuan.frames))
        await asyncio.gather(
            linh.send("register", {"instance": instance, "capability": {"host": "linh-box"}}),
            tuan.send("register", {"instance": instance, "capability": {"host": "tuan-box"}}),
        )
        replies = []
        for client, mark in zip((linh, tuan), marks, strict=True):
            replies.append((await client.wait_for(lambda c, mark=mark: replies_to_register(c, mark), timeout=15))[0])
        acked = [name for name, reply in zip(("linh", "tuan"), replies, strict=True) if reply["type"] == "register.ack"]
        refused = [reply["payload"] for reply in replies if reply["type"] == "error"]
        assert len(acked) == 1, replies
        assert [(error["code"], error["type"]) for error in refused] == [("instance_owned", "register")]
        row = agents_of(one, acme)[instance]
        assert row["identity"] == acked[0]
        assert row["capability"] == {"host": f"{acked[0]}-box"}
        winners.append(acked[0])
    assert len(agents_of(two, acme)) == 6
    # Both sockets are still open and answering.
    for name, client in (("linh", linh), ("tuan", tuan)):
        mark = len(client.frames)
        await client.send("register", {"instance": f"{name}-own"})
        assert (await client.next_of("register.ack", after=mark))["instance"] == f"{name}-own"
        await client.close()


async def test_silent_workers_age_out_while_heartbeating_ones_stay(live_instances, acme, closing):
    one, two = live_instances(2, RELAY_AGENT_TTL_MS="2000", RELAY_AGENT_SWEEP_MS="200")
    beating = await closing(connect(one, acme, "linh"))
    crashed = await closing(connect(two, acme, "tuan"))
    for client, instance in ((beating, "beating"), (crashed, "silent")):
        await client.send("register", {"instance": instance})
        await client.next_of("register.ack")
    # A worker that vanishes keeps its row until the TTL says otherwise; its instance's
    # sweeper (started by this connection) keeps running after the socket is gone.
    await crashed.close()
    assert set(agents_of(one, acme)) == {"beating", "silent"}

    async def heartbeat_forever() -> None:
        while True:
            await beating.send("heartbeat", {"instance": "beating"})
            await asyncio.sleep(0.2)

    heart = asyncio.create_task(heartbeat_forever())
    try:
        await until(lambda: "silent" not in agents_of(one, acme), timeout=20, interval=0.1)
        # A whole TTL more of heartbeats: the heartbeating worker outlives several sweeps.
        await asyncio.sleep(2.5)
        assert set(agents_of(two, acme)) == {"beating"}
    finally:
        heart.cancel()
    swept = [line for instance in (one, two) for line in instance.events("agent.swept")]
    assert [line["instance"] for line in swept] == ["silent"]
