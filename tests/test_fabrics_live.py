"""Presence and messages share the sockets but never each other's fabric (docs/contract.md, sections 3 and 4)."""

import pytest

from tests.support import WsClient, connect

pytestmark = pytest.mark.live

TIMINGS = {
    "RELAY_PRESENCE_GRACE_MS": "400",
    "RELAY_PRESENCE_TTL_MS": "1500",
    "RELAY_PRESENCE_REFRESH_MS": "400",
    "RELAY_PRESENCE_MARGIN_MS": "60",
}


async def test_a_message_is_never_delivered_as_presence_nor_presence_as_a_message(live_instances, acme, closing):
    a, b = live_instances(2, **TIMINGS)
    tuan = await closing(connect(b, acme, "tuan"))
    linh = await closing(WsClient.open(a.ws_url(acme.token("linh"))))
    await tuan.wait_for(lambda c: {"user": "linh", "state": "online"} in c.of_type("presence.changed"))

    fleet = str(acme.channels["fleet"].id)
    await linh.send("message.send", {"idem_key": "m-1", "channel": fleet, "text": "online?"})
    created = await tuan.next_of("message.created")
    assert (created["user"], created["text"]) == ("linh", "online?")

    await linh.close()
    await tuan.wait_for(lambda c: {"user": "linh", "state": "offline"} in c.of_type("presence.changed"), timeout=10)
    # Two transitions and one message, each on its own frame type and in its own shape only.
    assert [change for change in tuan.of_type("presence.changed") if change["user"] == "linh"] == [
        {"user": "linh", "state": "online"},
        {"user": "linh", "state": "offline"},
    ]
    assert all(set(change) == {"user", "state"} for change in tuan.of_type("presence.changed"))
    assert len(tuan.of_type("message.created")) == 1
    assert set(created) == {"id", "channel", "seq", "user", "text", "created_at"}
