"""What a lost notice cannot undo, across two real instances: gw0 hears every notice, gw1 none.

gw1 runs tests/lossy_settings.py, which drops the membership and rotation notices on arrival (as
pub/sub drops them while a subscriber reconnects); only its reconciliation, every
RELAY_PRESENCE_REFRESH_MS, is left to find what changed. In acme, linh and tuan share "fleet"
(private) and "general"; globex's zed is the other tenant, who must not notice a thing.
"""

import asyncio
import json
import subprocess
import sys

import pytest
from channels.db import database_sync_to_async

from relay.models import Environment
from tests.chat_helpers import send_payload
from tests.support import BASE_DIR, WAIT, WsClient, connect, http, logged, timings

pytestmark = pytest.mark.live

LOSSY = {"DJANGO_SETTINGS_MODULE": "tests.lossy_settings"}


def two_instances(live_instances) -> tuple:
    (gw0,) = live_instances(1, **timings())
    (gw1,) = live_instances(1, **timings(), **LOSSY)
    return gw0, gw1


def rotatesecret(instance, environment: str) -> subprocess.CompletedProcess:
    """`manage.py rotatesecret` run as an operator would, against the instances' database and Redis."""
    return subprocess.run(
        [sys.executable, "manage.py", "rotatesecret", environment],
        env=instance.env,
        capture_output=True,
        text=True,
        cwd=BASE_DIR,
        timeout=60,
    )


@database_sync_to_async
def fresh(environment: Environment) -> Environment:
    environment.refresh_from_db()
    return environment


async def test_rotatesecret_closes_the_environments_sockets_on_every_instance_and_no_others(
    live_instances, acme, globex, closing
):
    gw0, gw1 = two_instances(live_instances)
    old_secret = acme.environment.signing_secret
    old_token = acme.token("linh")
    linh = await closing(connect(gw0, acme, "linh"))
    tuan = await closing(connect(gw1, acme, "tuan"))
    zed = await closing(connect(gw1, globex, "zed"))

    done = await asyncio.to_thread(rotatesecret, gw0, "acme")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["environment"] == str(acme.environment.id)
    new_secret = (await fresh(acme.environment)).signing_secret
    assert new_secret != old_secret
    for secret in (old_secret, new_secret):
        assert secret not in done.stdout + done.stderr

    # gw0 heard the notice; gw1 heard nothing and found it at its next round.
    assert await linh.closed(WAIT) == 4401
    assert await tuan.closed(WAIT) == 4401
    await logged(gw1, "connection.revoked", user="tuan")
    # The other tenant's socket is untouched: still open, still served.
    ack = await zed.send_and_ack(send_payload(globex.channels["board"], "still here"))
    assert ack["type"] == "message.ack"
    assert zed.close_code is None

    for gw in (gw0, gw1):
        refused = await closing(WsClient.open(gw.ws_url(old_token)))
        assert await refused.closed(WAIT) == 4401
        again = await closing(connect(gw, acme, "linh"))  # a token signed with the new secret
        assert again.of_type("connection.ack")[0]["user"] == "linh"
        await again.close()


async def test_the_admin_action_revokes_like_the_command(live_instances, acme, globex, staff, closing):
    _, gw1 = two_instances(live_instances)
    tuan = await closing(connect(gw1, acme, "tuan"))
    zed = await closing(connect(gw1, globex, "zed"))
    response = await database_sync_to_async(staff.post)(
        "/admin/relay/environment/",
        {"action": "rotate_signing_secret", "_selected_action": [str(acme.environment.id)]},
    )
    assert response.status_code == 302
    assert await tuan.closed(WAIT) == 4401
    ack = await zed.send_and_ack(send_payload(globex.channels["board"], "still here"))
    assert ack["type"] == "message.ack"


async def test_a_removal_whose_notice_was_lost_still_stops_the_channels_frames(live_instances, acme, closing):
    gw0, gw1 = two_instances(live_instances)
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    linh = await closing(connect(gw1, acme, "linh"))  # on the instance that hears no notice
    tuan = await closing(connect(gw0, acme, "tuan"))
    before = (await tuan.send_and_ack(send_payload(fleet, "before")))["payload"]
    await linh.wait_for(lambda c: any(m["id"] == before["id"] for m in c.of_type("message.created")))

    status, _ = http("DELETE", f"{gw0.http_url}/v1/channels/{fleet.id}/members/linh", api_key=acme.api_key)
    assert status == 204
    await logged(gw1, "membership.repaired", user="linh", removed=1)

    after = (await tuan.send_and_ack(send_payload(fleet, "after the removal")))["payload"]
    barrier = (await tuan.send_and_ack(send_payload(general, "linh is still in general")))["payload"]
    # Linh still hears general (sent after the fleet message, so delivered after it) ...
    await linh.wait_for(lambda c: any(m["id"] == barrier["id"] for m in c.of_type("message.created")))
    # ... and no longer hears fleet.
    assert after["id"] not in [m["id"] for m in linh.of_type("message.created")]


async def test_a_users_versions_never_repeat_when_redis_forgets_them(live_instances, acme, redis_client, closing):
    # Rounds far apart, so that the forgetting and the next change fall between two of them.
    (lossy,) = live_instances(1, **timings(ttl=6000, refresh=2000), **LOSSY)
    (hearing,) = live_instances(1, **timings())
    fleet, general = acme.channels["fleet"], acme.channels["general"]
    linh = await closing(connect(lossy, acme, "linh"))
    tuan = await closing(connect(hearing, acme, "tuan"))
    member = f"{hearing.http_url}/v1/channels/{fleet.id}/members/linh"

    assert http("DELETE", member, api_key=acme.api_key)[0] == 204
    await logged(lossy, "membership.repaired", user="linh", removed=1)
    # Redis forgets everything (a restart, an eviction, an expiry), then linh's memberships change
    # as often as they had before (her two at the start and the removal): a counter that started
    # again would now read as the version her connection already saw.
    redis_client.flushall()
    for method, status in (("PUT", 201), ("DELETE", 204), ("PUT", 201)):
        assert http(method, member, api_key=acme.api_key)[0] == status
    await logged(lossy, "membership.repaired", user="linh", added=1)

    back = (await tuan.send_and_ack(send_payload(fleet, "welcome back")))["payload"]
    await linh.wait_for(lambda c: any(m["id"] == back["id"] for m in c.of_type("message.created")))
    barrier = (await tuan.send_and_ack(send_payload(general, "and general")))["payload"]
    await linh.wait_for(lambda c: any(m["id"] == barrier["id"] for m in c.of_type("message.created")))
