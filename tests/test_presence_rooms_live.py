"""Large channels against two real Daphne processes: counts instead of people, and the switch between them.

The cast (tests/conftest.py): in acme, linh and tuan share "fleet" and "general" (two members
each, small). Here "hall" adds mai, an and binh to them: five members, above the environment's
`large_room_members` of 3, so hall is large. Every "nothing arrived" sits after a barrier
(tests/support.py).
"""

import pytest

from tests.support import (
    add_channel,
    add_user,
    barrier,
    close_all,
    connect,
    heard,
    http,
    set_large_room_members,
    states,
    timings,
)

pytestmark = pytest.mark.live

THRESHOLD = 3


@pytest.fixture
async def hall(acme):
    for user_id in ("mai", "an", "binh"):
        await add_user(acme, user_id)
    await set_large_room_members(acme, THRESHOLD)
    return await add_channel(acme, "hall", "public", ("linh", "tuan", "mai", "an", "binh"))


def occupancy(client, channel) -> list[int]:
    return [frame["online"] for frame in client.of_type("presence.occupancy") if frame["channel"] == str(channel.id)]


async def test_a_large_channel_gives_counts_and_a_small_one_still_names_who_shares_it(live_instances, acme, hall):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    ((snapshot),) = linh.of_type("presence.snapshot")
    assert (snapshot["online"], snapshot["occupancy"]) == (["linh"], {str(hall.id): 1})
    mai = await connect(b, acme, "mai")
    # mai shares only hall with linh: a count, never her name.
    await linh.wait_for(lambda c: 2 in occupancy(c, hall))
    # tuan also shares fleet and general: he is announced as before, and counted.
    tuan = await connect(b, acme, "tuan")
    assert await heard(linh, "tuan", 1) == ["online"]
    await linh.wait_for(lambda c: occupancy(c, hall)[-1:] == [3])
    assert tuan.of_type("presence.snapshot")[0]["online"] == ["linh", "tuan"]
    assert tuan.of_type("presence.snapshot")[0]["occupancy"] == {str(hall.id): 3}
    await mai.close()
    # The last value always arrives: mai's `offline` brings the count back to 2.
    await linh.wait_for(lambda c: occupancy(c, hall)[-1:] == [2])
    probe = await barrier(a, acme, [linh])
    assert states(linh, "mai") == []
    await close_all(linh, tuan, probe)


async def test_a_channel_switches_mode_when_the_setting_or_its_members_cross_the_threshold(live_instances, acme, hall):
    a, b = live_instances(2, **timings())
    linh = await connect(a, acme, "linh")
    mai = await connect(b, acme, "mai")
    await linh.wait_for(lambda c: 2 in occupancy(c, hall))
    assert states(linh, "mai") == []
    # The setting raised above hall's five members: hall is small again, and linh hears that
    # its count ended, then who is in it, without reconnecting.
    await set_large_room_members(acme, 10)
    assert await heard(linh, "mai", 1) == ["online"]
    ended = {"type": "presence.occupancy", "payload": {"channel": str(hall.id), "online": 2, "large": False}}
    assert [frame for frame in linh.frames if "large" in frame["payload"]] == [ended]
    mai_online = {"type": "presence.changed", "payload": {"user": "mai", "state": "online"}}
    assert linh.frames.index(ended) < linh.frames.index(mai_online)
    # Six more members take hall past the threshold again: a count instead.
    for index in range(6):
        await add_user(acme, f"guest-{index}", ("hall",))
    counted = len(occupancy(linh, hall))
    await linh.wait_for(lambda c: len(occupancy(c, hall)) > counted)
    assert occupancy(linh, hall)[-1] == 2
    await mai.close()
    await linh.wait_for(lambda c: occupancy(c, hall)[-1:] == [1])
    probe = await barrier(a, acme, [linh])
    assert states(linh, "mai") == ["online"]
    await close_all(linh, probe)


async def test_a_member_added_live_to_a_large_channel_gets_its_count_and_is_counted_not_named(
    live_instances, acme, hall
):
    a, b = live_instances(2, **timings())
    await add_user(acme, "kim")
    linh = await connect(a, acme, "linh")
    kim = await connect(b, acme, "kim")
    ((snapshot),) = kim.of_type("presence.snapshot")
    assert snapshot["online"] == ["kim"] and "occupancy" not in snapshot
    status, _ = http("PUT", f"{b.http_url}/v1/channels/{hall.id}/members/kim", api_key=acme.api_key)
    assert status in (200, 201)
    # kim hears how many are in hall (linh and herself, once her refresh counts her there) ...
    await kim.wait_for(lambda c: occupancy(c, hall)[-1:] == [2])
    # ... and linh hears the count grow, never kim's name.
    await linh.wait_for(lambda c: occupancy(c, hall)[-1:] == [2])
    probe = await barrier(a, acme, [linh])
    assert states(linh, "kim") == []
    await close_all(linh, kim, probe)
