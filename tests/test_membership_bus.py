"""The membership bus: one subscription per process, and changes raced with a connect are never lost."""

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from relay import consumers, membership
from tests.support import Closing, Socket


async def _open(token: str, closing: Closing) -> tuple[Socket, dict]:
    socket = await closing(Socket.open(token))
    assert socket.frames[0]["type"] == "connection.ack"
    return socket, socket.frames[0]["payload"]


@pytest.mark.django_db(transaction=True)
async def test_a_connect_that_falls_behind_the_bus_memory_reads_its_channels_again(acme, monkeypatch, closing):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    monkeypatch.setattr(membership, "RECENT_CHANGES", 2)
    read_connect_for_real = consumers.read_connect
    reads = []

    async def busy_bus_meanwhile(token, extensions):
        read = await read_connect_for_real(token, extensions)
        reads.append("connect")
        # After the read: linh leaves fleet, then more changes than the bus remembers go by.
        await database_sync_to_async(membership.remove_member)(fleet, read.user)
        for _ in range(2):
            await database_sync_to_async(membership.remove_member)(general, acme.users["tuan"])
            await database_sync_to_async(membership.add_member)(general, acme.users["tuan"])
        bus = membership.bus()
        for _ in range(100):
            if bus.seq >= 5:
                break
            await asyncio.sleep(0.02)
        return read

    monkeypatch.setattr(consumers, "read_connect", busy_bus_meanwhile)
    read_channels = consumers.read_channel_ids

    async def counted(user):
        reads.append("channels")
        return await read_channels(user)

    monkeypatch.setattr(consumers, "read_channel_ids", counted)
    _, ack = await _open(acme.token("linh"), closing)
    assert reads == ["connect", "channels"]
    assert ack["channels"] == [str(general.id)]


@pytest.mark.django_db(transaction=True)
async def test_a_connect_within_the_bus_memory_reads_once_and_gets_the_change_replayed(acme, monkeypatch, closing):
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    read_connect_for_real = consumers.read_connect

    async def removed_after_the_read(token, extensions):
        read = await read_connect_for_real(token, extensions)
        await database_sync_to_async(membership.remove_member)(fleet, read.user)
        bus = membership.bus()
        for _ in range(100):
            if bus.seq >= 1:
                break
            await asyncio.sleep(0.02)
        return read

    monkeypatch.setattr(consumers, "read_connect", removed_after_the_read)
    linh, ack = await _open(acme.token("linh"), closing)
    # The read saw fleet; the removal that came after it is replayed, not lost.
    assert sorted(ack["channels"]) == sorted([str(fleet.id), str(general.id)])
    layer = get_channel_layer()
    await layer.group_send(f"chat.{fleet.id}", {"type": "message.created", "message": {}})
    await layer.group_send(
        f"chat.{general.id}",
        {
            "type": "message.created",
            "message": {
                "id": "m",
                "channel": str(general.id),
                "seq": 1,
                "user": "tuan",
                "text": "t",
                "created_at": "x",
            },
        },
    )
    assert (await linh.next_of("message.created"))["channel"] == str(general.id)
    assert membership.bus().listeners  # linh is listening


@pytest.mark.django_db(transaction=True)
async def test_a_closed_connection_stops_listening_on_the_bus(acme, closing):
    linh, _ = await _open(acme.token("linh"), closing)
    pk = acme.users["linh"].pk
    assert pk in membership.bus().listeners
    await linh.close()
    assert pk not in membership.bus().listeners


# ── reads and notices in version order (membership.Applied) ──────────────────
def test_a_read_from_before_a_change_keeps_the_change_applied_since():
    applied = membership.Applied()
    assert applied.notice("fleet", False, 5)  # removed at version 5
    assert applied.notice("lab", True, 6)  # added at version 6
    # A read at version 4 still had fleet and not lab.
    assert applied.sync({"fleet", "general"}, 4) == {"general", "lab"}
    # A read at version 6 says it all: the notices up to it are folded into it.
    assert applied.sync({"general", "lab"}, 6) == {"general", "lab"}
    assert applied.notices == {}


def test_a_read_older_than_the_last_read_and_a_notice_older_than_either_are_dropped():
    applied = membership.Applied()
    assert applied.sync({"general"}, 7) == {"general"}
    assert applied.sync({"general", "fleet"}, 6) is None
    assert not applied.notice("fleet", True, 7)  # the read at 7 already says
    assert applied.notice("fleet", True, 9)
    # Two instances' notices about one channel, the later one heard first.
    assert not applied.notice("fleet", False, 8)
    assert applied.sync({"general"}, 8) == {"general", "fleet"}
