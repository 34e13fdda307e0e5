"""A membership change reaches the channel's online set at once, not at the holder's next refresh.

A connecting watcher's snapshot reads its channels' online sets (presence/scripts.py,
CHANNEL_SEEN). A user added to a channel while online must be in that channel's set by the time
the API answers, or a co-member connecting right after the 201 gets a snapshot without them and,
since they publish nothing more, never learns (docs/contract.md: a snapshot lists every user
sharing a channel who is online now). A user added while offline must not be put there, and a
removed user is taken out.

The cast (tests/conftest.py): in acme, "hermit" belongs to nothing; "huddle" here holds tuan.
"""

import pytest

from presence.scripts import channel_online_key
from tests.support import add_channel, add_user, close_all, connect, http, timings, until

pytestmark = pytest.mark.live

# A refresh far slower than the steps below: only the membership change itself can have written
# the online set by the time the watcher connects.
SLOW_REFRESH = timings(ttl=30000, refresh=10000)


async def test_a_watcher_connecting_right_after_an_online_user_is_added_sees_them(live_instances, acme, redis_client):
    a, b = live_instances(2, **SLOW_REFRESH)
    huddle = await add_channel(acme, "huddle", "private", ("tuan",))
    await add_user(acme, "kim")
    hermit = await connect(a, acme, "hermit")
    key = channel_online_key(str(huddle.id))

    # hermit is online; kim is not. Both are added, on the instance that does not hold hermit.
    assert http("PUT", f"{b.http_url}/v1/channels/{huddle.id}/members/hermit", api_key=acme.api_key)[0] == 201
    assert http("PUT", f"{b.http_url}/v1/channels/{huddle.id}/members/kim", api_key=acme.api_key)[0] == 201
    tuan = await connect(b, acme, "tuan")

    assert tuan.of_type("presence.snapshot")[0]["online"] == ["hermit", "tuan"]
    assert redis_client.zscore(key, "hermit") is not None
    assert redis_client.zscore(key, "kim") is None

    # Removed: out of the channel's set (the instance holding hermit takes it out as it applies it).
    assert http("DELETE", f"{b.http_url}/v1/channels/{huddle.id}/members/hermit", api_key=acme.api_key)[0] == 204
    await until(lambda: redis_client.zscore(key, "hermit") is None)
    assert redis_client.zscore(key, "tuan") is not None
    await close_all(hermit, tuan)
