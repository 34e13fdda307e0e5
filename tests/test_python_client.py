"""relay_client against real Daphne instances on one Redis and one database.

Cast (conftest): in acme, linh and tuan share fleet and general; hermit belongs to nothing.
Here mai joins general too, as a third person whose presence the others watch. Every client
reconnects fast (back-off 0.1 s to 1 s) so an instance's restart is over in seconds.
"""

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from relay_client import (
    AgentRefused,
    Client,
    Error,
    IdentityMismatch,
    PresenceChanged,
    SendRefused,
    Signal,
    TooManyConnections,
    Unauthorized,
)

from chat.handlers import chat_group
from chat.models import Message
from chat.queries import message_json
from relay import tokens
from relay.models import Membership
from tests.chat_helpers import store_history
from tests.client_helpers import Application
from tests.support import Instance, WsClient, http

pytestmark = pytest.mark.live

FAST = {"retry_base": 0.1, "retry_cap": 1.0}
# Presence timings scaled down so an `offline` is decided while a test waits for it.
PRESENCE = {"RELAY_PRESENCE_GRACE_MS": "300", "RELAY_PRESENCE_MARGIN_MS": "100"}


def base(instance: Instance) -> str:
    return f"ws://127.0.0.1:{instance.port}"


@pytest.fixture
def cast(acme):
    """acme with mai in general; the channel ids by name."""
    acme.add_user("mai")
    Membership.objects.create(channel=acme.channels["general"], user=acme.users["mai"])
    return acme


def ids(tenant) -> dict[str, str]:
    return {name: str(channel.id) for name, channel in tenant.channels.items()}


async def token(tenant, user_id: str) -> str:
    return await database_sync_to_async(tenant.token)(user_id)


async def connected(instance: Instance, tenant, user_id: str, **options) -> Client:
    client = Client(base(instance), await token(tenant, user_id), **{**FAST, **options})
    await asyncio.wait_for(client.connect(), 30)
    return client


def presence_of(instance: Instance, tenant, channel: str) -> set[str]:
    status, body = http("GET", f"{instance.http_url}/v1/channels/{channel}/presence", api_key=tenant.api_key)
    assert status == 200, body
    return set(body["online"])


def agents_of(instance: Instance, tenant) -> dict[str, dict]:
    status, body = http("GET", f"{instance.http_url}/v1/agents", api_key=tenant.api_key)
    assert status == 200, body
    return {row["instance"]: row for row in body["agents"]}


def history_texts(instance: Instance, tenant, channel: str) -> list[str]:
    status, body = http("GET", f"{instance.http_url}/v1/channels/{channel}/messages?limit=500", api_key=tenant.api_key)
    assert status == 200, body
    return [m["text"] for m in body["messages"]]


async def eventually(condition, timeout: float = 20.0, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(interval)


# ── the surface ──────────────────────────────────────────────────────────────
async def test_connect_gives_the_snapshot_and_send_answers_with_the_ack(live_instances, cast, closing):
    a, b = live_instances(2)
    general = ids(cast)["general"]
    linh = await closing(connected(a, cast, "linh"))
    app = Application(linh)
    assert linh.user == "linh" and linh.connected
    assert linh.channels == {general, ids(cast)["fleet"]}

    tuan = await closing(connected(b, cast, "tuan"))
    await app.until(lambda app: "tuan" in linh.online)
    assert PresenceChanged(user="tuan", state="online") in app.events

    ack = await linh.send(general, "hello from Python")
    assert (ack.channel, ack.seq) == (general, 1) and ack.id
    (created,) = await app.until(lambda app: app.messages(general))
    assert (created.id, created.seq, created.user, created.text) == (ack.id, 1, "linh", "hello from Python")
    await tuan.close()
    await linh.close()
    await app.finished()
    assert app.stopped_by is None and app.ended
    assert app.disconnects() == [], "close() is not a lost connection"


async def test_a_refused_send_raises_with_its_code_and_the_next_send_still_works(live_instances, cast, closing):
    (a,) = live_instances(1)
    hermit = await closing(connected(a, cast, "hermit"))
    with pytest.raises(SendRefused) as refused:
        await hermit.send(ids(cast)["general"], "not mine", idem_key="k-1")
    assert (refused.value.error.code, refused.value.idem_key) == ("not_a_member", "k-1")
    linh = await closing(connected(a, cast, "linh"))
    assert (await linh.send(ids(cast)["general"], "mine")).seq == 1


async def test_the_first_connection_delivers_each_channels_history_first_then_live_ones(live_instances, cast, closing):
    (a,) = live_instances(1)
    general, fleet = ids(cast)["general"], ids(cast)["fleet"]
    await database_sync_to_async(store_history)(cast.channels["general"], cast.users["tuan"], 620)
    linh = await closing(connected(a, cast, "linh"))
    app = Application(linh)
    await linh.send(general, "live")
    await app.until(lambda app: len(app.seqs(general)) == 621)
    assert app.seqs(general) == list(range(1, 622))
    assert app.messages(general)[-1].text == "live"
    assert app.seqs(fleet) == []
    assert linh.cursor == {general: 621, fleet: 0}


async def test_a_later_client_starts_from_the_cursor_an_earlier_one_kept(live_instances, cast, closing):
    (a,) = live_instances(1)
    general, fleet = ids(cast)["general"], ids(cast)["fleet"]
    first = await closing(connected(a, cast, "linh"))
    for n in range(3):
        await first.send(general, f"early {n}")
    app = Application(first)
    await app.until(lambda app: len(app.seqs(general)) == 3)
    kept = first.cursor
    await first.close()

    await database_sync_to_async(store_history)(cast.channels["general"], cast.users["tuan"], 2)
    later = await closing(connected(a, cast, "linh", cursor=kept))
    later_app = Application(later)
    await later_app.until(lambda app: len(app.seqs(general)) == 2)
    assert later_app.seqs(general) == [4, 5] and later_app.seqs(fleet) == []


async def test_signals_reach_the_other_members_client_and_a_refusal_comes_as_an_error_event(
    live_instances, cast, closing
):
    a, b = live_instances(2)
    general = ids(cast)["general"]
    linh = await closing(connected(a, cast, "linh"))
    tuan = await closing(connected(b, cast, "tuan"))
    hermit = await closing(connected(a, cast, "hermit"))
    linh_app, tuan_app, hermit_app = Application(linh), Application(tuan), Application(hermit)

    await linh.signal(general, "typing", {"draft": 1})
    (heard,) = await tuan_app.until(lambda app: [e for e in app.events if isinstance(e, Signal)])
    assert heard == Signal(channel=general, user="linh", name="typing", data={"draft": 1})
    await hermit.signal(general, "typing")
    (refused,) = await hermit_app.until(lambda app: [e for e in app.events if isinstance(e, Error)])
    assert (refused.code, refused.type) == ("not_a_member", "signal")
    # Later signals each client does hear: linh never hears her own, and hermit's refused one went nowhere.
    await linh.signal(general, "stopped")
    await tuan.signal(general, "typing")
    await tuan_app.until(lambda app: len([e for e in app.events if isinstance(e, Signal)]) == 2)
    await linh_app.until(lambda app: [e for e in app.events if isinstance(e, Signal)])
    assert [(e.user, e.name) for e in tuan_app.events if isinstance(e, Signal)] == [
        ("linh", "typing"),
        ("linh", "stopped"),
    ]
    assert [e.user for e in linh_app.events if isinstance(e, Signal)] == ["tuan"]
    with pytest.raises(ValueError):
        await linh.signal(general, "x" * 33)
    with pytest.raises(ValueError):
        await linh.signal(general, "typing", {"text": "x" * 250})


# ── dead instances ───────────────────────────────────────────────────────────
async def test_killing_the_readers_instance_mid_stream_loses_and_repeats_nothing(live_instances, cast, closing):
    a, b = live_instances(2, **PRESENCE)
    general = ids(cast)["general"]
    sender = await closing(connected(a, cast, "linh"))
    mai = await closing(connected(a, cast, "mai"))
    reader = await closing(connected(b, cast, "tuan"))
    assert {"linh", "mai", "tuan"} <= reader.online
    started_with = reader.online
    app = Application(reader)
    total = 80
    sent: list[int] = []

    async def stream() -> None:
        for n in range(1, total + 1):
            sent.append((await sender.send(general, f"m{n}")).seq)
            await asyncio.sleep(0.02)

    streaming = asyncio.create_task(stream())
    await app.until(lambda app: len(app.seqs(general)) >= 15)
    b.kill()
    await app.until(lambda app: app.disconnects())
    # While the reader is away: mai leaves (her offline is decided after the grace) and the stream goes on.
    await mai.close()
    await eventually(
        lambda: ("mai", "offline") in [(line["user"], line["state"]) for line in a.events("presence.published")]
    )
    await asyncio.to_thread(b.start)
    await asyncio.wait_for(streaming, 60)
    await app.until(lambda app: len(app.seqs(general)) >= total, timeout=30)

    assert app.seqs(general) == list(range(1, total + 1)) == sent
    assert [m.text for m in app.messages(general)] == [f"m{n}" for n in range(1, total + 1)]
    assert app.disconnects() == [1006] and app.reconnects() == 1
    # The resume, not the history endpoint, brought what was missed (logged once its sends are done).
    await eventually(lambda: any(line["messages"] > 0 for line in b.events("message.resumed")))
    truth = await asyncio.to_thread(presence_of, a, cast, general)
    assert truth == {"linh", "tuan"}
    await app.until(lambda app: reader.online == truth)
    assert app.presence_view(started_with) == reader.online


async def test_sends_cut_off_by_their_instance_dying_land_once(live_instances, cast, closing):
    a, b = live_instances(2)
    general = ids(cast)["general"]
    sender = await closing(connected(a, cast, "linh"))
    sender_app = Application(sender)
    watcher = await closing(connected(b, cast, "tuan"))
    watcher_app = Application(watcher)
    total = 40
    sends = [asyncio.create_task(sender.send(general, f"m{n}")) for n in range(total)]
    await asyncio.wait(sends, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    a.kill()
    answered_before_the_kill = sum(send.done() for send in sends)
    await asyncio.to_thread(a.start)
    acks = await asyncio.wait_for(asyncio.gather(*sends), 60)

    assert answered_before_the_kill < total, "the kill interrupted no send"
    assert sorted(ack.seq for ack in acks) == list(range(1, total + 1))
    texts = await asyncio.to_thread(history_texts, b, cast, general)
    assert sorted(texts) == sorted(f"m{n}" for n in range(total))
    await watcher_app.until(lambda app: len(app.seqs(general)) >= total)
    assert watcher_app.seqs(general) == list(range(1, total + 1))
    assert sender_app.reconnects() == 1


# ── reconnect rules ──────────────────────────────────────────────────────────
async def test_a_refused_token_stops_the_client_unless_the_callable_gives_a_new_one(live_instances, cast, closing):
    (a,) = live_instances(1)
    good = await token(cast, "linh")
    with pytest.raises(Unauthorized):
        await asyncio.wait_for(Client(base(a), "forged", **FAST).connect(), 30)

    same_calls: list[str] = []

    def always_forged() -> str:
        same_calls.append("forged")
        return "forged"

    with pytest.raises(Unauthorized):
        await asyncio.wait_for(Client(base(a), always_forged, **FAST).connect(), 30)
    assert len(same_calls) == 2

    fresh_calls: list[str] = []

    async def forged_then_good() -> str:
        fresh_calls.append("called")
        return "forged" if len(fresh_calls) == 1 else good

    client = closing.keep(Client(base(a), forged_then_good, **FAST))
    await asyncio.wait_for(client.connect(), 30)
    assert client.user == "linh" and len(fresh_calls) == 2


async def test_after_a_rotation_only_a_client_whose_callable_mints_anew_comes_back(live_instances, cast, closing):
    (a,) = live_instances(1)
    stale_token = await token(cast, "linh")
    stale = closing.keep(Client(base(a), lambda: stale_token, **FAST))
    # A sync callable: the client runs it in a thread, where it may block (here, on the database).
    fresh = closing.keep(Client(base(a), lambda: cast.token("tuan"), **FAST))
    await asyncio.wait_for(stale.connect(), 30)
    await asyncio.wait_for(fresh.connect(), 30)
    stale_app, fresh_app = Application(stale), Application(fresh)

    a.kill()
    await database_sync_to_async(tokens.rotate_signing_secret)(cast.environment)
    await asyncio.to_thread(a.start)

    await fresh_app.until(lambda app: app.reconnects() == 1)
    await stale_app.finished()
    assert isinstance(stale_app.stopped_by, Unauthorized)
    assert stale_app.disconnects() == [1006] and stale_app.reconnects() == 0
    with pytest.raises(Unauthorized):
        await stale.send(ids(cast)["general"], "too late")
    assert (await fresh.send(ids(cast)["general"], "still here")).seq == 1


async def test_too_many_connections_stops_the_client_unless_the_callable_gives_a_new_token(
    live_instances, cast, closing
):
    (a,) = live_instances(1, RELAY_MAX_CONNECTIONS_PER_USER="1")
    holder = await closing(WsClient.open(a.ws_url(await token(cast, "linh"))))
    await holder.next_of("connection.ack")
    with pytest.raises(TooManyConnections):
        await asyncio.wait_for(Client(base(a), await token(cast, "linh"), **FAST).connect(), 30)

    minted: list[str] = []

    async def mint() -> str:
        # A token is new when its claims are: tokens minted in the same second differ by their TTL.
        minted.append(await database_sync_to_async(cast.token)("linh", 3600 + len(minted)))
        return minted[-1]

    patient = closing.keep(Client(base(a), mint, **FAST))
    connecting = asyncio.create_task(patient.connect())
    await eventually(lambda: len(minted) >= 3)
    assert not connecting.done()
    await holder.close()
    await asyncio.wait_for(connecting, 20)
    assert patient.connected and len(set(minted)) == len(minted)


# ── gaps ─────────────────────────────────────────────────────────────────────
async def test_a_seq_that_skips_is_filled_from_the_history_endpoint(live_instances, cast, closing):
    (a,) = live_instances(1)
    general = ids(cast)["general"]
    reader = await closing(connected(a, cast, "tuan", gap_wait=0.05))
    app = Application(reader)
    sender = await closing(connected(a, cast, "linh"))
    await sender.send(general, "first")
    await app.until(lambda app: app.seqs(general) == [1])
    # Stored without a live frame (as when the fan-out fails): the next live one skips two seqs.
    await database_sync_to_async(store_history)(cast.channels["general"], cast.users["linh"], 2)
    await sender.send(general, "after the gap")
    await app.until(lambda app: len(app.seqs(general)) == 4)
    assert app.seqs(general) == [1, 2, 3, 4]
    assert [m.text for m in app.messages(general)] == ["first", "message 2", "message 3", "after the gap"]
    assert reader.cursor[general] == 4
    assert app.reconnects() == 0


async def test_live_frames_out_of_order_reach_the_application_in_order_once(live_instances, cast, closing):
    (a,) = live_instances(1)
    general = ids(cast)["general"]
    reader = await closing(connected(a, cast, "tuan", gap_wait=30, cursor=dict.fromkeys(ids(cast).values(), 0)))
    app = Application(reader)
    # Stored only once the connection's resume is over, so only live frames can bring them.
    await eventually(lambda: a.events("message.resumed"))
    await database_sync_to_async(store_history)(cast.channels["general"], cast.users["linh"], 3)
    stored = await database_sync_to_async(
        lambda: [message_json(m) for m in Message.objects.filter(channel=cast.channels["general"]).order_by("seq")]
    )()
    layer = get_channel_layer()

    async def publish(message: dict) -> None:
        await layer.group_send(chat_group(general), {"type": "message.created", "message": message})

    # As two instances may publish them: 2 first, then 1, then 1 again (a copy), then 3. One group
    # delivers in publish order, so a 2 let through before the 1 would read [2, 1] below.
    await publish(stored[1])
    await publish(stored[0])
    await app.until(lambda app: app.seqs(general) == [1, 2])
    await publish(stored[0])
    await publish(stored[2])
    await app.until(lambda app: len(app.seqs(general)) >= 3)
    assert app.seqs(general) == [1, 2, 3]


async def test_the_resume_starts_after_the_highest_contiguous_seq(live_instances, cast, closing):
    (a,) = live_instances(1)
    general = ids(cast)["general"]
    reader = await closing(connected(a, cast, "tuan", gap_wait=30, cursor=dict.fromkeys(ids(cast).values(), 0)))
    app = Application(reader)
    # Stored only once the connection's resume is over, so only live frames can bring them.
    await eventually(lambda: a.events("message.resumed"))
    await database_sync_to_async(store_history)(cast.channels["general"], cast.users["linh"], 3)
    stored = await database_sync_to_async(
        lambda: [message_json(m) for m in Message.objects.filter(channel=cast.channels["general"]).order_by("seq")]
    )()
    layer = get_channel_layer()
    for message in (stored[0], stored[2]):
        await layer.group_send(chat_group(general), {"type": "message.created", "message": message})
    await app.until(lambda app: app.seqs(general) == [1])

    a.kill()
    await asyncio.to_thread(a.start)
    await app.until(lambda app: len(app.seqs(general)) == 3)
    assert app.seqs(general) == [1, 2, 3]
    # The first connection's resume (from its cursor of zeros) sent nothing; the second sent 2 and 3:
    # seq 3 was seen but 2 was not, so the position it resumed from stayed at 1.
    await eventually(lambda: len(a.events("message.resumed")) == 2)
    assert [line["messages"] for line in a.events("message.resumed")] == [0, 2]


# ── agents ───────────────────────────────────────────────────────────────────
async def a_ttl_passes(silent: WsClient, instance: Instance, tenant, name: str) -> None:
    """Register `name` on `silent`, which never beats, and wait until it is swept: a TTL and a sweep have passed."""
    await silent.send("register", {"instance": name})
    await silent.wait_for(lambda s: any(ack["instance"] == name for ack in s.of_type("register.ack")))
    await eventually(lambda: name not in agents_of(instance, tenant))


async def test_an_agent_registers_heartbeats_comes_back_after_a_restart_and_deregisters(live_instances, cast, closing):
    one, two = live_instances(2, RELAY_AGENT_TTL_MS="1500", RELAY_AGENT_SWEEP_MS="200")
    worker = await closing(connected(one, cast, "linh"))
    silent = await closing(WsClient.open(two.ws_url(await token(cast, "tuan"))))
    await silent.send("register", {"instance": "silent"})
    await silent.next_of("register.ack")

    async with worker.agent("w-1", "linh", {"family": "gpu", "weight": 2.5}, ttl=1.5) as agent:
        rows = await asyncio.to_thread(agents_of, two, cast)
        assert rows["w-1"]["identity"] == "linh"
        assert rows["w-1"]["capability"] == {"family": "gpu", "weight": 2.5}
        assert agent.registered_at == rows["w-1"]["registered_at"]
        # Heartbeats keep the row through several TTLs; the registration that sends none is swept.
        await eventually(lambda: "silent" not in agents_of(two, cast))
        await a_ttl_passes(silent, two, cast, "silent-2")
        assert "w-1" in await asyncio.to_thread(agents_of, two, cast)

        one.kill()
        await eventually(lambda: "w-1" not in agents_of(two, cast))
        await asyncio.to_thread(one.start)
        await eventually(lambda: "w-1" in agents_of(two, cast))
        await a_ttl_passes(silent, two, cast, "silent-3")
        assert "w-1" in await asyncio.to_thread(agents_of, two, cast)

    assert "w-1" not in await asyncio.to_thread(agents_of, two, cast)


async def test_an_agent_is_refused_for_another_identity_or_an_instance_someone_else_owns(live_instances, cast, closing):
    (a,) = live_instances(1)
    linh = await closing(connected(a, cast, "linh"))
    tuan = await closing(connected(a, cast, "tuan"))
    with pytest.raises(IdentityMismatch):
        async with linh.agent("w-1", "tuan"):
            pass
    async with linh.agent("w-1", "linh"):
        with pytest.raises(AgentRefused) as refused:
            async with tuan.agent("w-1", "tuan"):
                pass
        assert refused.value.error.code == "instance_owned"
        assert agents_of(a, cast)["w-1"]["identity"] == "linh"
    assert agents_of(a, cast) == {}
