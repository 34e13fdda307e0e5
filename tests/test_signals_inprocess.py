"""Signals inside one process: what a connection leaves behind when it goes.

Cast (conftest): in acme, linh and tuan share fleet and general.
The rate limiter counts in this process's memory; these tests read its storage.
"""

import pytest
from channels.db import database_sync_to_async

from chat.signals import SIGNALS_PER_SECOND
from relay import membership
from tests.support import Socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_presence_service")]


def counted() -> set[str]:
    """The signal limit's keys in the process's connection-limit storage (one per connection and channel)."""
    return {key for key in SIGNALS_PER_SECOND.limiter.storage.events if f"/{SIGNALS_PER_SECOND.name}/" in key}


async def test_a_closed_connections_signal_counts_are_forgotten(acme, closing):
    fleet = str(acme.channels["fleet"].id)
    tuan = await closing(Socket.open(acme.token("tuan")))
    await tuan.next_of("presence.snapshot")
    before = counted()
    for round_number in range(1, 21):
        linh = await closing(Socket.open(acme.token("linh")))
        await linh.next_of("presence.snapshot")
        await linh.send("signal", {"channel": fleet, "name": "typing"})
        # Counted while connected: tuan heard it, and linh's connection has its count.
        await tuan.wait_for(lambda socket, n=round_number: len(socket.of_type("signal")) == n)
        assert len(counted() - before) == 1
        await linh.close()
        assert counted() == before
    await tuan.close()


async def test_a_channel_left_takes_the_connections_count_in_it(acme, closing):
    fleet, general = str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    tuan = await closing(Socket.open(acme.token("tuan")))
    linh = await closing(Socket.open(acme.token("linh")))
    await linh.next_of("presence.snapshot")
    before = counted()
    await linh.send("signal", {"channel": fleet, "name": "typing"})
    await tuan.wait_for(lambda socket: len(socket.of_type("signal")) == 1)
    [fleet_count] = counted() - before
    await database_sync_to_async(membership.remove_member)(acme.channels["fleet"], acme.users["linh"])
    # Still connected and counted in general, once fleet is no longer hers.
    await linh.send("signal", {"channel": general, "name": "typing"})
    await tuan.wait_for(lambda socket: len(socket.of_type("signal")) == 2)
    await linh.send("signal", {"channel": fleet, "name": "typing"})
    await linh.wait_for(lambda socket: any(e["code"] == "not_a_member" for e in socket.of_type("error")))
    assert fleet_count not in counted()
    assert len(counted() - before) == 1
    for socket in (linh, tuan):
        await socket.close()
