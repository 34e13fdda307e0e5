"""Transitions say how many copies of them exist; a connection delivers each once."""

import uuid

from presence.extension import STATE_KEY, presence_transition
from presence.fabric import Dedup, parse_transition, transition_message


class _Watcher:
    """Just what presence's event handler reads of a connection."""

    def __init__(self, *channels: str) -> None:
        self.channel_ids = set(channels)
        self.state = {STATE_KEY: Dedup()}
        self.frames: list[dict] = []

    async def send_frame(self, frame_type: str, payload: dict) -> None:
        self.frames.append({"type": frame_type, "payload": payload})


async def test_a_single_copy_is_delivered_without_remembering_its_id():
    fleet, general = str(uuid.uuid4()), str(uuid.uuid4())
    watcher = _Watcher(fleet, general)
    await presence_transition(watcher, transition_message("tuan", "online", str(uuid.uuid4()), fleet, copies=1))
    assert watcher.frames == [{"type": "presence.changed", "payload": {"user": "tuan", "state": "online"}}]
    assert len(watcher.state[STATE_KEY]) == 0


async def test_several_copies_are_still_delivered_once():
    fleet, general = str(uuid.uuid4()), str(uuid.uuid4())
    watcher = _Watcher(fleet, general)
    transition = str(uuid.uuid4())
    for channel in (fleet, general):
        await presence_transition(watcher, transition_message("tuan", "offline", transition, channel, copies=2))
    assert watcher.frames == [{"type": "presence.changed", "payload": {"user": "tuan", "state": "offline"}}]
    assert len(watcher.state[STATE_KEY]) == 1


def test_a_copy_count_must_be_a_positive_integer():
    channel = str(uuid.uuid4())
    good = transition_message("linh", "online", str(uuid.uuid4()), channel, copies=3)
    assert parse_transition(good).copies == 3
    assert parse_transition(transition_message("linh", "online", str(uuid.uuid4()), channel)).copies is None
    for bad in (0, -1, "2", 1.5, None):
        assert parse_transition({**good, "copies": bad}) is None
