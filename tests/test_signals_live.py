"""Signals across two real instances: who hears them, who does not, and what refuses them.

Cast (conftest): in acme, linh and tuan share fleet and general; hermit belongs to nothing
(here he shares "lab" with tuan). globex has its own linh and zed in "board". A negative check
("nobody else heard it") is always taken after a later signal the same socket did hear.
"""

import asyncio

import pytest
from channels.db import database_sync_to_async

from relay.models import Environment
from tests.support import WsClient, add_channel, connect

pytestmark = pytest.mark.live


def signals(client: WsClient) -> list[dict]:
    return client.of_type("signal")


async def signal(client: WsClient, channel: str, name: str = "typing", **data: object) -> None:
    await client.send("signal", {"channel": channel, "name": name, **({"data": data} if data else {})})


async def heard(client: WsClient, count: int) -> list[dict]:
    """Wait until `client` heard `count` signals; return them all."""
    await client.wait_for(lambda c: len(signals(c)) >= count)
    return signals(client)


async def refused(client: WsClient, code: str) -> dict:
    """Wait for an `error` of `code` answering a signal; return it."""
    return await client.wait_for(
        lambda c: next((e for e in c.of_type("error") if e["code"] == code and e.get("type") == "signal"), None)
    )


@database_sync_to_async
def set_signal_max_members(tenant, most: int) -> None:
    Environment.objects.filter(id=tenant.environment.id).update(signal_max_members=most)


async def test_a_signal_reaches_the_other_members_on_both_instances_and_nobody_else(
    live_instances, acme, globex, closing
):
    a, b = live_instances(2)
    await add_channel(acme, "lab", "private", ("tuan", "hermit"))
    fleet, lab, board = (str(c.id) for c in (acme.channels["fleet"], acme.channels["lab"], globex.channels["board"]))
    linh = await closing(connect(a, acme, "linh"))
    linh_elsewhere = await closing(connect(b, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    tuan_here = await closing(connect(a, acme, "tuan"))
    hermit = await closing(connect(a, acme, "hermit"))
    globex_linh = await closing(connect(b, globex, "linh"))
    zed = await closing(connect(a, globex, "zed"))

    await signal(linh, fleet, "typing", draft=True)
    expected = {"channel": fleet, "user": "linh", "name": "typing", "data": {"draft": True}}
    assert await heard(tuan, 1) == [expected]
    assert await heard(tuan_here, 1) == [expected]

    # Later signals each socket does hear, so linh's would already be there.
    await signal(tuan, fleet, "typing")
    assert await heard(linh_elsewhere, 1) == [{"channel": fleet, "user": "tuan", "name": "typing", "data": {}}]
    await heard(linh, 1)
    await signal(tuan, lab, "typing")
    assert [s["channel"] for s in await heard(hermit, 1)] == [lab]
    await signal(zed, board, "typing")
    assert [s["user"] for s in await heard(globex_linh, 1)] == ["zed"]
    await signal(globex_linh, board, "typing")
    assert [s["user"] for s in await heard(zed, 1)] == ["linh"]

    # The sender's own connections never hear it back; outsiders and the other tenant never do.
    assert [s["user"] for s in signals(linh) + signals(linh_elsewhere)] == ["tuan", "tuan"]
    assert all(s["channel"] != fleet for s in signals(hermit) + signals(globex_linh) + signals(zed))
    # Nothing was stored: a resume from zero brings no message back.
    again = await closing(connect(b, acme, "tuan", {fleet: 0, lab: 0}))
    await signal(linh, fleet, "typing")
    await heard(again, 1)
    assert again.of_type("message.created") == []


async def test_more_than_two_a_second_in_one_channel_is_rate_limited_and_relays_nothing(live_instances, acme, closing):
    a, b = live_instances(2)
    fleet, general = str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    for n in range(3):
        await signal(linh, fleet, "typing", n=n)
    error = await refused(linh, "rate_limited")
    assert 0 < error["retry_after_ms"] <= 1000
    # Another channel has a window of its own.
    await signal(linh, general, "typing", n=3)
    await heard(tuan, 3)
    # Once the window has passed, the channel takes signals again; behind it, the dropped one is not there.
    await asyncio.sleep(error["retry_after_ms"] / 1000)
    await signal(linh, fleet, "typing", n=4)
    assert sorted(s["data"]["n"] for s in await heard(tuan, 4)) == [0, 1, 3, 4]
    assert len(linh.of_type("error")) == 1


async def test_a_channel_larger_than_signal_max_members_refuses_signals_until_the_setting_allows_them(
    live_instances, acme, closing
):
    a, b = live_instances(2)
    fleet = str(acme.channels["fleet"].id)
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    await set_signal_max_members(acme, 1)
    await signal(linh, fleet, "typing", n=1)
    assert "1 members" in (await refused(linh, "signals_disabled"))["message"]
    # The setting is read per signal: raised, the channel takes them again, without a restart.
    await set_signal_max_members(acme, 2)
    await signal(linh, fleet, "typing", n=2)
    assert [s["data"] for s in await heard(tuan, 1)] == [{"n": 2}]


async def test_a_non_member_and_bad_signals_are_refused_and_relay_nothing(live_instances, acme, globex, closing):
    a, b = live_instances(2)
    fleet, board = str(acme.channels["fleet"].id), str(globex.channels["board"].id)
    linh = await closing(connect(a, acme, "linh"))
    tuan = await closing(connect(b, acme, "tuan"))
    hermit = await closing(connect(a, acme, "hermit"))

    await signal(hermit, fleet, "typing")
    await refused(hermit, "not_a_member")
    await signal(linh, board, "typing")  # another tenant's channel reads as not hers
    await refused(linh, "not_a_member")
    bad = [
        {"channel": fleet, "name": ""},
        {"channel": fleet, "name": "x" * 33},
        {"channel": fleet, "name": "typ\x07ing"},
        {"channel": fleet, "name": "typing", "data": {"text": "x" * 250}},
        {"channel": fleet, "name": "typing", "data": ["not", "an", "object"]},
        {"channel": fleet, "name": "typing", "data": None},
        {"channel": fleet, "name": "typing", "extra": 1},
        {"channel": "not-a-channel", "name": "typing"},
    ]
    for payload in bad:
        await tuan.send("signal", payload)
    await tuan.wait_for(lambda c: len(c.of_type("error")) == len(bad))
    assert {(e["code"], e["type"]) for e in tuan.of_type("error")} == {("invalid_frame", "signal")}
    # 32 characters and 256 bytes of data are allowed.
    await signal(tuan, fleet, "y" * 32, text="x" * 245)
    (accepted,) = await heard(linh, 1)
    assert accepted["name"] == "y" * 32 and accepted["user"] == "tuan"
    await signal(linh, fleet, "typing")
    assert [s["user"] for s in await heard(tuan, 1)] == ["linh"]
