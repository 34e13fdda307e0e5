"""Presence's process-wide fan-out (presence.delivery): one delivery per transition, order kept per connection.

Against the real Redis and Relay's pub/sub layer: transitions are published as another instance
would, and read back through the process's one subscription.
"""

import asyncio
import json
import logging
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from presence import delivery, extension
from presence.fabric import TRANSITION, Dedup, group_name, transition_message
from relay import registry
from relay.asgi import application
from relay.layers import group_send_many
from relay.logging import event_fields
from relay.membership import EVENT, MEMBERSHIP_GROUP

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The transitions about others that reached a connection through its own queue (the consumer's handler).

    (A connection's own `online` comes back through the fabric too, queued or not as it happens
    to arrive before or after the connection is live, and is dropped either way.)
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
    communicator = WebsocketCommunicator(application, f"/v1/ws?token={token}")
    connected, _ = await communicator.connect(timeout=5)
    assert connected
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
    await group_send_many(
        get_channel_layer(),
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
    linh = WebsocketCommunicator(application, f"/v1/ws?token={acme.token('linh')}")
    assert (await linh.connect(timeout=5))[0]
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
    removal = {"type": EVENT, "user": acme.users["linh"].pk, "channel": fleet, "member": False}
    # Read off Redis together: the removal is queued for linh's consumer, and the transition
    # must not go past it, or linh would hear of tuan in a channel she has just left.
    await group_send_many(
        get_channel_layer(),
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
    failures = [event_fields(record) for record in caplog.records if record.getMessage() == "presence.failed"]
    assert failures == [{"op": "deliver", "error": "RuntimeError"}]
    assert queued == []
    await linh.disconnect()
    await tuan.disconnect()


async def test_a_connections_own_online_coming_back_to_it_is_dropped_unvalidated(acme, queued, monkeypatch):
    den = str((await database_sync_to_async(acme.add_channel)("den", "private", members=("hermit",))).id)
    validated: list[str] = []

    def counted(parse):
        def parse_counted(message: dict):
            validated.append(message["user"])
            return parse(message)

        return parse_counted

    # Both ways a transition reaches a connection: the process's fan-out and the connection's queue.
    monkeypatch.setattr(delivery, "parse_transition", counted(delivery.parse_transition))
    monkeypatch.setattr(extension, "parse_transition", counted(extension.parse_transition))
    hermit = await _open_live(acme.token("hermit"), "hermit")
    # His own `online` comes back to him alone through Redis, after it was sent ahead; another
    # user's transition in the same channel, behind it, is validated and delivered.
    spirit = transition_message("spirit", "online", str(uuid.uuid4()), den)
    await get_channel_layer().group_send(group_name(den), spirit)
    frames = await _frames_until(hermit, "presence.changed", "spirit")
    assert _changed(frames) == [{"user": "spirit", "state": "online"}]
    assert validated == ["spirit"]
    # Its copy came back before spirit's, and nothing is left expecting it.
    assert delivery.fanout().own == {}
    await hermit.disconnect()


class _Connection:
    """What the fan-out reads of a connection: its channel name and its state."""

    def __init__(self, channel_name: str) -> None:
        self.channel_name = channel_name
        self.state = {delivery.STATE_KEY: Dedup()}


def _sent_ahead(fanout: delivery.Fanout, conn: _Connection, den: str, copies: int) -> dict:
    own = transition_message(conn.channel_name, "online", str(uuid.uuid4()), den, copies=copies)
    conn.state[delivery.STATE_KEY].sent_ahead(own["transition"], copies)
    fanout.expect_own(conn, conn.state[delivery.STATE_KEY])
    return own


def _assert_forgotten(fanout: delivery.Fanout, conn: _Connection, own: dict) -> None:
    """Nothing is expected of `conn` any more, in the fan-out or its Dedup: a later copy is not dropped."""
    assert fanout.own == {}
    assert conn.state[delivery.STATE_KEY].ahead is None
    fanout.received(own, (conn.channel_name,))
    assert fanout.pending.get_nowait() == (own, (conn.channel_name,))
    fanout._task.cancel()


async def test_the_copies_of_an_own_online_are_dropped_as_they_are_read_even_before_the_connection_is_live():
    fanout = delivery.Fanout()
    hermit, linh = _Connection("relay.hermit"), _Connection("relay.linh")
    den = str(uuid.uuid4())
    # Neither is live (in `watchers`) yet: the election's copies come back while it is admitted.
    own = _sent_ahead(fanout, hermit, den, copies=2)
    fanout.received(own, (hermit.channel_name,))
    assert fanout.pending.empty()
    # Another transition in the group is handed to the delivery task, and so is a malformed one.
    other = transition_message("spirit", "online", str(uuid.uuid4()), den)
    fanout.received(other, (hermit.channel_name,))
    malformed = {**other, "transition": ["not", "an", "id"]}
    fanout.received(malformed, (hermit.channel_name,))
    # The own copy's last one, shared with linh, still goes to linh.
    fanout.received(own, (hermit.channel_name, linh.channel_name))
    assert [fanout.pending.get_nowait() for _ in range(3)] == [
        (other, (hermit.channel_name,)),
        (malformed, (hermit.channel_name,)),
        (own, (linh.channel_name,)),
    ]
    # Counted to the last copy, then forgotten in both places.
    _assert_forgotten(fanout, hermit, own)


async def test_an_election_that_published_nothing_withdraws_its_expected_copies():
    fanout = delivery.Fanout()
    tuan = _Connection("relay.tuan")
    own = _sent_ahead(fanout, tuan, str(uuid.uuid4()), copies=1)
    assert list(fanout.own) == [own["transition"]]
    fanout.withdraw_own(tuan.state[delivery.STATE_KEY])
    _assert_forgotten(fanout, tuan, own)


async def test_a_connection_closing_before_its_copies_came_back_leaves_nothing_expected():
    fanout = delivery.Fanout()
    tuan, linh = _Connection("relay.tuan"), _Connection("relay.linh")
    _sent_ahead(fanout, tuan, str(uuid.uuid4()), copies=2)
    kept = _sent_ahead(fanout, linh, str(uuid.uuid4()), copies=1)
    fanout.gone(tuan)
    assert list(fanout.own) == [kept["transition"]]
    assert tuan.state[delivery.STATE_KEY].ahead is None
