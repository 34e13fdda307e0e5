"""Hostile frames against a real instance: each gets `invalid_frame`, and the connection lives on.

Every input here once raised out of the consumer: the socket died with 1011 and the connection's
release never ran, so its user stayed online to every co-member and kept a slot until the instance
restarted. Each test therefore checks three things after the bad frame: the error, that the same
socket still answers a good frame, and that closing it afterwards is heard as `offline`.
"""

import uuid

import pytest

from tests.support import WAIT, WsClient, connect, heard, timings

pytestmark = pytest.mark.live

# Each of these once raised out of `receive()`: an unhashable type, the parser's recursion,
# an integer literal past Python's 4,300-digit limit, and a lone surrogate the schema layer and
# the JSON encoder cannot encode, as a key and as a value.
DEEP = 1_000
HOSTILE = {
    "a list as the type": '{"type": [], "payload": {}}',
    "an object as the type": '{"type": {"a": 1}, "payload": {}}',
    "JSON nested 1,000 deep": '{"type": "message.send", "payload": ' + "[" * DEEP + "]" * DEEP + "}",
    "nested 1,000 deep at the top": "[" * DEEP + "]" * DEEP,
    "an integer of 5,000 digits": '{"type": "message.send", "payload": {"idem_key": ' + "9" * 5_000 + "}}",
    "a lone surrogate as a key": '{"type": "message.send", "payload": {"\\ud800": 1}}',
    "a lone surrogate as the type": '{"type": "\\ud800", "payload": {}}',
    "a lone surrogate in the text": '{"type": "message.send", "payload": {"idem_key": "k", "channel": "%s", '
    '"text": "a\\udfffb"}}',
    "NaN as a number": '{"type": "register", "payload": {"instance": "w-1", "capability": {"weight": NaN}}}',
    "Infinity as a number": '{"type": "register", "payload": {"instance": "w-1", "capability": {"weight": Infinity}}}',
}


async def still_answers(client: WsClient, channel_id: str) -> None:
    """The socket still carries a good frame: a `message.send` is stored and acknowledged."""
    key = uuid.uuid4().hex
    after = len(client.frames)
    await client.send("message.send", {"idem_key": key, "channel": channel_id, "text": "still here"})
    ack = await client.next_of("message.ack", after=after, timeout=WAIT)
    assert ack["idem_key"] == key


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_a_hostile_frame_is_invalid_and_leaves_the_connection_releasable(live_instances, acme, name, closing):
    (instance,) = live_instances(1, **timings(grace=300, margin=100))
    fleet = str(acme.channels["fleet"].id)
    tuan = await closing(connect(instance, acme, "tuan"))
    linh = await closing(connect(instance, acme, "linh"))
    assert await heard(tuan, "linh", 1) == ["online"]

    after = len(linh.frames)
    raw = HOSTILE[name].replace("%s", fleet)
    await linh.send_raw(raw)
    error = await linh.next_of("error", after=after, timeout=WAIT)
    assert error["code"] == "invalid_frame"
    await still_answers(linh, fleet)
    assert linh.close_code is None

    await linh.close()
    assert await heard(tuan, "linh", 2) == ["online", "offline"]
    assert "Traceback" not in instance.log_path.read_text()
