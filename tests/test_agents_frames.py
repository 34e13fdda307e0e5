"""The register / heartbeat / deregister families on a real socket (in-process) and a real database.

Cast: in acme, linh runs the worker instances; tuan is another identity of the same tenant
who must not be able to take over, refresh or remove them. globex's own linh shows that
instance ids are per tenant.
"""

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import OperationalError
from prometheus_client import REGISTRY

from agents import actions
from agents.models import Registration
from agents.sweeper import sweeper
from relay import registry
from relay.frames import StrictModel
from tests.support import T0, events, next_frame, nothing_but, open_communicator

pytestmark = pytest.mark.django_db(transaction=True)


class Worker:
    """One WebSocket connection of a worker, speaking frames."""

    def __init__(self, communicator: WebsocketCommunicator, ack: dict) -> None:
        self.communicator = communicator
        self.connection_id = ack["connection_id"]
        self.closed = False

    @classmethod
    async def connect(cls, token: str) -> "Worker":
        communicator = await open_communicator(token)
        ack = await next_frame(communicator)
        assert ack["type"] == "connection.ack"
        return cls(communicator, ack["payload"])

    async def send(self, frame_type: str, payload: object) -> None:
        await self.communicator.send_to(text_data=json.dumps({"type": frame_type, "payload": payload}))

    async def send_raw(self, text: str) -> None:
        await self.communicator.send_to(text_data=text)

    async def receive(self) -> dict:
        return await next_frame(self.communicator)

    async def register(self, instance: str, **capability: object) -> dict:
        await self.send("register", {"instance": instance, "capability": capability})
        return await self.receive()

    async def nothing_more(self) -> bool:
        return await nothing_but(self.communicator)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.communicator.disconnect()


@pytest.fixture(autouse=True)
async def _stop_sweeper():
    """The first connection of a test starts the sweeper on the test's loop; stop it with the test."""
    yield
    await sweeper().stop()


def row(instance: str, tenant) -> Registration:
    return Registration.objects.select_related("identity").get(environment=tenant.environment, instance=instance)


def rows_exist(**lookups: object) -> bool:
    return Registration.objects.filter(**lookups).exists()


# database_sync_to_async rather than the async ORM: it closes its connection after each
# call, so PostgreSQL can drop the test database when the session ends.
row_async = database_sync_to_async(row)
rows_exist_async = database_sync_to_async(rows_exist)
count_async = database_sync_to_async(lambda: Registration.objects.count())


async def test_register_is_acknowledged_and_the_row_is_visible(acme, agents_clock, caplog, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    ack = await linh.register("w-1", cognition="planner", weight=0.5, family="gpt", host="box-7")
    assert ack == {"type": "register.ack", "payload": {"instance": "w-1", "registered_at": T0.isoformat()}}
    stored = await row_async("w-1", acme)
    assert stored.identity.external_id == "linh"
    assert stored.connection_id == linh.connection_id
    assert stored.capability() == {"cognition": "planner", "weight": 0.5, "family": "gpt", "host": "box-7"}
    assert (stored.registered_at, stored.last_seen) == (T0, T0)
    registered = events(caplog, "agent.registered")
    assert registered == [{"instance": "w-1", "environment": str(acme.environment.id)}]


async def test_a_capability_may_be_omitted_or_partial(acme, agents_clock, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.send("register", {"instance": "bare"})
    assert (await linh.receive())["type"] == "register.ack"
    assert (await linh.register("partial", weight=2))["type"] == "register.ack"
    assert (await row_async("bare", acme)).capability() == {}
    assert (await row_async("partial", acme)).capability() == {"weight": 2.0}


class NoPayload(StrictModel):
    pass


@pytest.fixture
def state_probe():
    """A frame that answers with the connection's agent state, registered the way an app would."""

    @registry.frame("test.agents_state", NoPayload)
    async def probe(conn, payload: NoPayload) -> None:
        await conn.send_frame("test.agents_state", conn.state.get("agents", {}))

    yield
    del registry.frames["test.agents_state"]


async def test_the_connection_keeps_what_it_registered_in_memory(acme, agents_clock, state_probe, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1", family="gpt", weight=1.5)
    await linh.register("w-2")
    await linh.send("deregister", {"instance": "w-2"})
    assert (await linh.receive())["type"] == "deregister.ack"
    tuan = await closing(Worker.connect(acme.token("tuan")))
    assert (await tuan.register("w-1"))["payload"]["code"] == "instance_owned"
    await linh.send("test.agents_state", {})
    assert (await linh.receive())["payload"] == {"w-1": {"family": "gpt", "weight": 1.5}}
    # A refused registration leaves the connection's state as it was.
    await tuan.send("test.agents_state", {})
    assert (await tuan.receive())["payload"] == {}


async def test_re_registration_by_the_same_identity_keeps_registered_at_and_refreshes_the_rest(
    acme, agents_clock, closing
):
    first = await closing(Worker.connect(acme.token("linh")))
    await first.register("w-1", cognition="planner", host="box-7")
    await first.close()
    # The worker reconnects later on a new connection, with a changed capability.
    later = agents_clock.advance(seconds=20)
    second = await closing(Worker.connect(acme.token("linh")))
    ack = await second.register("w-1", family="claude")
    assert ack["payload"] == {"instance": "w-1", "registered_at": T0.isoformat()}
    stored = await row_async("w-1", acme)
    assert (stored.registered_at, stored.last_seen) == (T0, later)
    assert stored.connection_id == second.connection_id
    # Omitted fields are cleared: the capability is the latest registration's, whole.
    assert stored.capability() == {"family": "claude"}


def registrations_counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("relay_agent_registrations_total", {"outcome": outcome}) or 0.0


async def test_another_identity_cannot_take_over_an_instance(acme, agents_clock, caplog, closing):
    before = {outcome: registrations_counted(outcome) for outcome in ("created", "refreshed", "rejected")}
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1", host="box-7")
    agents_clock.advance(seconds=5)
    tuan = await closing(Worker.connect(acme.token("tuan")))
    refused = await tuan.register("w-1", host="evil")
    assert refused["type"] == "error"
    assert refused["payload"]["code"] == "instance_owned"
    assert refused["payload"]["type"] == "register"
    stored = await row_async("w-1", acme)
    assert (stored.identity.external_id, stored.host, stored.last_seen) == ("linh", "box-7", T0)
    assert stored.connection_id == linh.connection_id
    rejected = events(caplog, "agent.rejected")
    assert rejected == [{"instance": "w-1", "reason": "instance_owned", "environment": str(acme.environment.id)}]
    # Tuan's socket is still open and his own instances register fine.
    assert (await tuan.register("t-1"))["type"] == "register.ack"
    assert (await linh.register("w-1"))["type"] == "register.ack"
    counted = {outcome: registrations_counted(outcome) - before[outcome] for outcome in before}
    assert counted == {"created": 2, "refreshed": 1, "rejected": 1}


async def test_heartbeat_refreshes_the_callers_own_row_without_a_reply(acme, agents_clock, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1")
    later = agents_clock.advance(seconds=10)
    await linh.send("heartbeat", {"instance": "w-1"})
    # A register after the heartbeat proves the heartbeat was handled (frames are handled in order).
    assert (await linh.register("w-2"))["payload"]["instance"] == "w-2"
    assert (await row_async("w-1", acme)).last_seen == later
    assert await linh.nothing_more()


async def test_a_foreign_or_unknown_heartbeat_is_a_silent_no_op(acme, agents_clock, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1")
    agents_clock.advance(seconds=10)
    tuan = await closing(Worker.connect(acme.token("tuan")))
    await tuan.send("heartbeat", {"instance": "w-1"})
    await tuan.send("heartbeat", {"instance": "nobody"})
    assert (await tuan.register("t-1"))["type"] == "register.ack"
    assert await tuan.nothing_more()
    assert (await row_async("w-1", acme)).last_seen == T0
    assert not await rows_exist_async(instance="nobody")


async def test_deregister_removes_the_callers_own_row(acme, agents_clock, caplog, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1")
    await linh.send("deregister", {"instance": "w-1"})
    assert await linh.receive() == {"type": "deregister.ack", "payload": {"instance": "w-1"}}
    assert not await rows_exist_async(instance="w-1")
    assert [e["instance"] for e in events(caplog, "agent.deregistered")] == ["w-1"]


async def test_a_foreign_or_unknown_deregister_is_silent_and_harmless(acme, agents_clock, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1")
    tuan = await closing(Worker.connect(acme.token("tuan")))
    await tuan.register("t-1")
    await tuan.send("deregister", {"instance": "w-1"})
    await tuan.send("deregister", {"instance": "nobody"})
    # His own deregister after the two is acknowledged, so the two were handled, silently.
    await tuan.send("deregister", {"instance": "t-1"})
    assert await tuan.receive() == {"type": "deregister.ack", "payload": {"instance": "t-1"}}
    assert await tuan.nothing_more()
    assert (await row_async("w-1", acme)).identity.external_id == "linh"


async def test_a_disconnect_keeps_the_row(acme, agents_clock, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1")
    await linh.close()
    assert (await row_async("w-1", acme)).identity.external_id == "linh"
    tuan = await closing(Worker.connect(acme.token("tuan")))
    assert (await tuan.register("w-1"))["payload"]["code"] == "instance_owned"


async def test_instance_ids_are_per_tenant(acme, globex, agents_clock, closing):
    acme_linh = await closing(Worker.connect(acme.token("linh")))
    globex_linh = await closing(Worker.connect(globex.token("linh")))
    assert (await acme_linh.register("w-1", host="acme-box"))["type"] == "register.ack"
    assert (await globex_linh.register("w-1", host="globex-box"))["type"] == "register.ack"
    assert (await row_async("w-1", acme)).host == "acme-box"
    assert (await row_async("w-1", globex)).host == "globex-box"
    # Neither tenant's worker reaches the other's row.
    agents_clock.advance(seconds=5)
    await globex_linh.send("heartbeat", {"instance": "w-1"})
    await globex_linh.send("deregister", {"instance": "w-1"})
    assert await globex_linh.receive() == {"type": "deregister.ack", "payload": {"instance": "w-1"}}
    assert (await row_async("w-1", acme)).last_seen == T0
    assert not await rows_exist_async(environment=globex.environment)


MALFORMED = {
    "unknown field": '{"instance": "w", "extra": 1}',
    "unknown capability field": '{"instance": "w", "capability": {"speed": 3}}',
    "missing instance": '{"capability": {}}',
    "instance not a string": '{"instance": 17}',
    "instance empty": '{"instance": ""}',
    "instance over-long": json.dumps({"instance": "w" * 129}),
    "instance with a newline": '{"instance": "w\\n1"}',
    "instance with a NUL": '{"instance": "w\\u0000"}',
    "instance with DEL": '{"instance": "w\\u007f"}',
    "instance null": '{"instance": null}',
    "capability not an object": '{"instance": "w", "capability": "fast"}',
    "capability a list": '{"instance": "w", "capability": []}',
    "capability null": '{"instance": "w", "capability": null}',
    "cognition not a string": '{"instance": "w", "capability": {"cognition": 5}}',
    "cognition empty": '{"instance": "w", "capability": {"cognition": ""}}',
    "family over-long": json.dumps({"instance": "w", "capability": {"family": "f" * 129}}),
    "host with a tab": '{"instance": "w", "capability": {"host": "a\\tb"}}',
    "host null": '{"instance": "w", "capability": {"host": null}}',
    "weight a string": '{"instance": "w", "capability": {"weight": "0.5"}}',
    "weight a boolean": '{"instance": "w", "capability": {"weight": true}}',
    "weight null": '{"instance": "w", "capability": {"weight": null}}',
    "payload a list": "[]",
    "payload a string": '"w"',
}


@pytest.mark.parametrize("payload", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_malformed_register_is_rejected_and_writes_nothing(acme, agents_clock, payload, closing):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.send_raw(f'{{"type": "register", "payload": {payload}}}')
    error = await linh.receive()
    assert error["type"] == "error"
    assert (error["payload"]["code"], error["payload"]["type"]) == ("invalid_payload", "register")
    assert not await rows_exist_async()
    # The socket stays open: a good register afterwards is acknowledged and written.
    assert (await linh.register("w", weight=1))["type"] == "register.ack"
    assert await count_async() == 1


# Not JSON at all (RFC 8259 has no NaN or Infinity, and 1e999 is no double), so not a register
# frame either: `invalid_frame`, as for any frame that does not parse.
NOT_JSON_NUMBERS = {
    "weight NaN": '{"instance": "w", "capability": {"weight": NaN}}',
    "weight Infinity": '{"instance": "w", "capability": {"weight": Infinity}}',
    "weight -Infinity": '{"instance": "w", "capability": {"weight": -Infinity}}',
    "weight 1e999": '{"instance": "w", "capability": {"weight": 1e999}}',
}


@pytest.mark.parametrize("payload", NOT_JSON_NUMBERS.values(), ids=NOT_JSON_NUMBERS.keys())
async def test_a_weight_that_is_not_a_json_number_is_an_invalid_frame_and_writes_nothing(
    acme, agents_clock, payload, closing
):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.send_raw(f'{{"type": "register", "payload": {payload}}}')
    error = await linh.receive()
    assert (error["type"], error["payload"]["code"]) == ("error", "invalid_frame")
    assert not await rows_exist_async()
    assert (await linh.register("w", weight=1))["type"] == "register.ack"
    assert await count_async() == 1


@pytest.mark.parametrize("family", ["heartbeat", "deregister"])
@pytest.mark.parametrize(
    "payload",
    ['{"instance": "w-1", "extra": 1}', "{}", '{"instance": 1}', '{"instance": ""}', '{"instance": null}', "[]"],
)
async def test_a_malformed_heartbeat_or_deregister_is_rejected_and_changes_nothing(
    acme, agents_clock, family, payload, closing
):
    linh = await closing(Worker.connect(acme.token("linh")))
    await linh.register("w-1")
    agents_clock.advance(seconds=5)
    await linh.send_raw(f'{{"type": "{family}", "payload": {payload}}}')
    error = await linh.receive()
    assert (error["payload"]["code"], error["payload"]["type"]) == ("invalid_payload", family)
    assert (await row_async("w-1", acme)).last_seen == T0
    await linh.send(family, {"instance": "w-1"})
    if family == "deregister":
        assert (await linh.receive())["type"] == "deregister.ack"
    else:
        assert (await linh.register("w-2"))["type"] == "register.ack"
        assert (await row_async("w-1", acme)).last_seen == agents_clock.now


async def test_a_database_fault_answers_unavailable_and_the_socket_stays_open(
    acme, agents_clock, monkeypatch, caplog, closing
):
    linh = await closing(Worker.connect(acme.token("linh")))

    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    working = actions.do_register
    monkeypatch.setattr(actions, "do_register", locked)
    error = await linh.register("w-1")
    assert error["payload"] == {
        "code": "unavailable",
        "message": "the agent registry is unavailable, try again",
        "type": "register",
    }
    failed = events(caplog, "agent.failed")
    assert failed == [{"op": "register", "error": "OperationalError"}]
    monkeypatch.setattr(actions, "do_register", working)
    assert (await linh.register("w-1"))["type"] == "register.ack"
