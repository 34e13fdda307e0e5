"""Presence's process-wide fan-out (presence.delivery): one delivery per transition, order kept per connection.

Against the real Redis and Relay's pub/sub layer: transitions are published as another instance
would, and read back through the process's one subscription.
"""

import asyncio
import json
import logging
import time
import uuid

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from presence import delivery, extension
from presence.fabric import TRANSITION, group_name, transition_message
from relay import registry
from relay.membership import EVENT, MEMBERSHIP_GROUP
from tests.support import events, open_communicator, until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The transitions about others that reached a connection through its own queue (the consumer's handler).

    (A connection's own `online` comes back through the fabric too, queued or not as it happens
    to arrive before or after the connection is live.)
    """
    seen: list[dict] = []

    async def counted(conn, message: dict) -> None:
        if message.get("user") != conn.user_id:
            seen.append(message)
        await extension.presence_transition(conn, message)

    monkeypatch.setitem(registry.events, TRANSITION, counted)
    return seen


async def _frames_until(communicator: WebsocketCommunicator, frame_type: str, user: str) -> list[dict]:
    """Every frame up to and including the first `frame_type` about `user`."""
    frames = []
    while True:
        frame = json.loads(await communicator.receive_from(timeout=5))
        frames.append(frame)
        if frame["type"] == frame_type and frame["payload"].get("user") == user:
            return frames


async def _open_live(token: str, user: str) -> WebsocketCommunicator:
    communicator = await open_communicator(token)
    # Ack, snapshot, then the user's own `online`: live from here.
    await _frames_until(communicator, "presence.changed", user)
    return communicator


def _changed(frames: list[dict]) -> list[dict]:
    return [frame["payload"] for frame in frames if frame["type"] == "presence.changed"]


async def test_a_live_watcher_gets_a_transition_from_the_process_not_through_its_queue(acme, queued):
    fleet, general = str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    linh = await _open_live(acme.token("linh"), "linh")
    transition = str(uuid.uuid4())
    # As another instance publishes it: one copy to each of tuan's channels.
    await get_channel_layer().group_send_many(
        [
            (group_name(channel), transition_message("tuan", "online", transition, channel, copies=2))
            for channel in (fleet, general)
        ],
    )
    frames = await _frames_until(linh, "presence.changed", "tuan")
    assert _changed(frames) == [{"user": "tuan", "state": "online"}]
    assert queued == []
    assert await linh.receive_nothing(timeout=0.2)  # the second copy was deduplicated, as before
    await linh.disconnect()
    assert not delivery.fanout().watchers


async def test_a_transition_raced_with_a_connect_is_queued_behind_the_snapshot(acme, queued, monkeypatch):
    fleet = str(acme.channels["fleet"].id)
    layer = get_channel_layer()
    admit = extension.PresenceExtension.admit
    raced = str(uuid.uuid4())

    async def a_transition_during_the_election(self, conn):
        await admit(self, conn)
        # The groups are joined: tuan's `online` arrives before linh's snapshot is sent.
        await layer.group_send(group_name(fleet), transition_message("tuan", "online", raced, fleet, copies=1))
        for _ in range(100):
            if layer.backlog(conn.channel_name):
                break
            await asyncio.sleep(0.01)

    monkeypatch.setattr(extension.PresenceExtension, "admit", a_transition_during_the_election)
    linh = await open_communicator(acme.token("linh"))
    frames = await _frames_until(linh, "presence.changed", "tuan")
    types = [frame["type"] for frame in frames]
    assert types.index("presence.snapshot") < len(types) - 1  # the snapshot came first
    assert [message["transition"] for message in queued] == [raced]

    # Live now: the next one comes from the process, not through the queue.
    await layer.group_send(group_name(fleet), transition_message("tuan", "offline", str(uuid.uuid4()), fleet, copies=1))
    assert _changed(await _frames_until(linh, "presence.changed", "tuan")) == [{"user": "tuan", "state": "offline"}]
    assert len(queued) == 1
    await linh.disconnect()


async def test_a_transition_read_behind_a_membership_removal_waits_for_it_and_is_dropped(acme, queued):
    fleet, general = str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    linh = await _open_live(acme.token("linh"), "linh")
    removal = {"type": EVENT, "user": acme.users["linh"].pk, "channel": fleet, "member": False, "version": 1}
    # Read off Redis together: the removal is queued for linh's consumer, and the transition
    # must not go past it, or linh would hear of tuan in a channel she has just left.
    await get_channel_layer().group_send_many(
        [
            (MEMBERSHIP_GROUP, removal),
            (group_name(fleet), transition_message("tuan", "online", str(uuid.uuid4()), fleet, copies=1)),
            (group_name(general), transition_message("hermit", "online", str(uuid.uuid4()), general, copies=1)),
        ],
    )
    frames = await _frames_until(linh, "presence.changed", "hermit")
    assert _changed(frames) == [{"user": "hermit", "state": "online"}]
    assert [message["user"] for message in queued] == ["tuan", "hermit"]
    await linh.disconnect()


async def test_one_watchers_failure_does_not_cost_the_others_their_frame(acme, queued, monkeypatch, caplog):
    fleet = str(acme.channels["fleet"].id)
    linh = await _open_live(acme.token("linh"), "linh")
    tuan = await _open_live(acme.token("tuan"), "tuan")
    await _frames_until(linh, "presence.changed", "tuan")
    fanout = delivery.fanout()
    broken = next(conn for conn in fanout.watchers.values() if conn.user_id == "tuan")

    async def refused(frame_type: str, payload: dict) -> None:
        raise RuntimeError("a socket that cannot be written")

    monkeypatch.setattr(broken, "send_frame", refused)
    with caplog.at_level(logging.ERROR, logger="presence"):
        await get_channel_layer().group_send(
            group_name(fleet), transition_message("hermit", "online", str(uuid.uuid4()), fleet, copies=1)
        )
        assert _changed(await _frames_until(linh, "presence.changed", "hermit")) == [
            {"user": "hermit", "state": "online"}
        ]
    assert events(caplog, "presence.failed") == [{"op": "deliver", "error": "RuntimeError"}]
    assert queued == []
    await linh.disconnect()
    await tuan.disconnect()


async def test_a_copy_sent_again_is_told_once_and_only_to_connections_there_at_the_loss(acme, queued, redis_client):
    # Its publisher sends it again after a pub/sub loss (`_copy_around_loss`): no connection
    # remembers the id of a single-copy transition, and one that joined after this process was
    # whole again heard the first or read what it said.
    fleet = str(acme.channels["fleet"].id)
    linh = await _open_live(acme.token("linh"), "linh")
    layer, heard, lost = get_channel_layer(), str(uuid.uuid4()), str(uuid.uuid4())
    back = layer.back_at()
    redis_client.client_kill_filter(_type="pubsub")
    await until(lambda: layer.back_at() > back)
    tuan = await _open_live(acme.token("tuan"), "tuan")
    for message in (
        transition_message("hermit", "online", heard, fleet, copies=1),
        transition_message("hermit", "online", heard, fleet, copies=1, again=True),
        # Lost on its way here the first time: its copy is told to linh, who was there.
        transition_message("hermit", "offline", lost, fleet, copies=1, again=True),
        transition_message("zed", "online", str(uuid.uuid4()), fleet, copies=1),
    ):
        await layer.group_send(group_name(fleet), message)
    seen_by_linh = _changed(await _frames_until(linh, "presence.changed", "zed"))
    seen_by_tuan = _changed(await _frames_until(tuan, "presence.changed", "zed"))
    hermit = [{"user": "hermit", "state": "online"}, {"user": "hermit", "state": "offline"}]
    assert [change for change in seen_by_linh if change["user"] == "hermit"] == hermit
    assert [change for change in seen_by_tuan if change["user"] == "hermit"] == hermit[:1]
    await linh.disconnect()
    await tuan.disconnect()


async def test_a_transition_raced_with_a_connect_once_the_process_delivers_is_kept_for_after_the_snapshot(
    acme, queued, monkeypatch
):
    fleet = str(acme.channels["fleet"].id)
    layer = get_channel_layer()
    # tuan is live: the process takes the presence groups' messages itself from here.
    tuan = await _open_live(acme.token("tuan"), "tuan")
    admit = extension.PresenceExtension.admit
    raced = str(uuid.uuid4())

    async def a_transition_during_the_election(self, conn):
        await admit(self, conn)
        await layer.group_send(group_name(fleet), transition_message("hermit", "online", raced, fleet, copies=1))
        await until(lambda: conn.state[delivery.HELD_KEY])

    monkeypatch.setattr(extension.PresenceExtension, "admit", a_transition_during_the_election)
    linh = await open_communicator(acme.token("linh"))
    frames = await _frames_until(linh, "presence.changed", "hermit")
    types = [frame["type"] for frame in frames]
    assert types.index("presence.snapshot") < types.index("presence.changed")  # the snapshot came first
    assert _changed(frames)[-1] == {"user": "hermit", "state": "online"}
    # Kept by the process, not put on linh's queue; and nothing is kept once she is live.
    assert queued == []
    assert not delivery.fanout().joining
    await linh.disconnect()
    await tuan.disconnect()


def _writing(seconds: float) -> None:
    """Keep the loop busy for `seconds`, as writes to sockets do."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_the_fan_out_lets_the_loop_run_once_its_slice_of_the_turn_is_spent(monkeypatch):
    fanout = delivery.fanout()
    ran: list[str] = []
    monkeypatch.setattr(delivery, "FANOUT_SLICE_SECONDS", 60)
    asyncio.get_running_loop().call_soon(ran.append, "other work")
    await fanout._pace()
    _writing(0.002)
    await fanout._pace()
    assert ran == []  # within its slice: the writes go on
    monkeypatch.setattr(delivery, "FANOUT_SLICE_SECONDS", 0.001)
    _writing(0.002)
    await fanout._pace()
    assert ran == ["other work"]


def test_a_kept_view_holds_the_snapshot_then_every_change_and_shares_the_snapshots_ids():
    # Two connections' snapshots, each decoded into its own copies of the ids.
    first = delivery.View(["tuan", "linh", "mai"])
    second = delivery.View(["".join(["li", "nh"]), "an"])
    assert ("linh" in first, "mai" in first, "an" in first, "binh" in first) == (True, True, False, False)
    # Every view that names a user holds the one interned copy of its id.
    assert first._snapshot[0] is second._snapshot[1]
    # Changes after the snapshot win over it, both ways.
    first.discard("mai")
    first.add("an")
    assert ("mai" in first, "an" in first, "tuan" in first) == (False, True, True)
    assert "an" in second and "mai" not in second
