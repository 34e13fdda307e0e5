"""/v1/schema/frames.json: every frame both ways, what relay_client decodes, and real frames from a live instance."""

import dataclasses
import json
import types
import uuid
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import jsonschema_rs
import pytest
from django.test import Client
from relay_client import events

from relay import registry
from tests.support import close_all, connect

# JSON Schema's name for each JSON type the client's dataclasses use.
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


@pytest.fixture
def schema() -> dict:
    response = Client().get("/v1/schema/frames.json")
    assert response.status_code == 200
    return response.json()


def validator(schema: dict, direction: str) -> Any:
    """A validator of one direction's frames (`ClientFrame` or `ServerFrame`)."""
    return jsonschema_rs.validator_for({**schema, "oneOf": [{"$ref": f"#/$defs/{direction}"}]})


def definitions(schema: dict, direction: str) -> dict[str, dict]:
    """One direction's frame definitions, by frame type (a type both ways has one in each)."""
    found = [schema["$defs"][ref["$ref"].removeprefix("#/$defs/")] for ref in schema["$defs"][direction]["oneOf"]]
    return {definition["properties"]["type"]["const"]: definition for definition in found}


def frame_types(schema: dict, direction: str) -> set[str]:
    return set(definitions(schema, direction))


def payload_schema(schema: dict, frame_type: str, direction: str) -> dict:
    payload = definitions(schema, direction)[frame_type]["properties"]["payload"]
    return schema["$defs"][payload["$ref"].removeprefix("#/$defs/")] if "$ref" in payload else payload


def json_type(hint: Any) -> dict:
    """The JSON Schema a client dataclass field's type stands for, in the terms the server's schema uses."""
    origin = get_origin(hint)
    if origin is Literal:
        return {"type": "string", "enum": sorted(get_args(hint))}
    if origin is tuple:
        return {"type": "array", "items": json_type(get_args(hint)[0])}
    if origin is dict:
        values = get_args(hint)[1]
        return {"type": "object"} if values is Any else {"type": "object", "values": json_type(values)}
    if origin in (Union, types.UnionType):
        members = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return json_type(members[0])
        return {"anyOf": sorted((json_type(member) for member in members), key=str)}
    return {"type": JSON_TYPES[hint]}


def described(field: dict, schema: dict) -> dict:
    """The same terms read from the server's schema of one field."""
    if "$ref" in field:
        target = schema["$defs"][field["$ref"].removeprefix("#/$defs/")]
        values = [described(value, schema) for value in target["properties"].values()]
        unique = sorted({json.dumps(value, sort_keys=True) for value in values})
        merged = [json.loads(value) for value in unique]
        return {"type": "object", "values": merged[0] if len(merged) == 1 else {"anyOf": merged}}
    if "anyOf" in field:
        members = [member for member in field["anyOf"] if member != {"type": "null"}]
        if len(members) == 1:
            return described(members[0], schema)
        return {"anyOf": sorted((described(member, schema) for member in members), key=str)}
    if field.get("type") == "array":
        return {"type": "array", "items": described(field["items"], schema)}
    if field.get("type") == "object" and "additionalProperties" in field:
        values = field["additionalProperties"]
        if values is True:
            return {"type": "object"}  # any JSON value (a signal's `data`)
        if isinstance(values, dict) and "$ref" in values:
            # A map of id to an object (rich presence's statuses): the client checks it is one.
            return {"type": "object", "values": {"type": "object"}}
        return {"type": "object", "values": described(values, schema)}
    if "enum" in field:
        return {"type": field["type"], "enum": sorted(field["enum"])}
    return {"type": field["type"]}


def test_the_schema_lists_every_frame_the_server_handles_and_sends(schema):
    assert frame_types(schema, "ClientFrame") == set(registry.frames)
    assert frame_types(schema, "ServerFrame") == set(registry.server_frames)
    assert {"message.send", "register", "heartbeat", "deregister"} <= set(registry.frames)
    assert {"connection.ack", "presence.snapshot", "presence.changed", "message.created", "error"} <= set(
        registry.server_frames
    )


def test_the_schema_refuses_what_the_server_refuses(schema):
    clients = validator(schema, "ClientFrame")
    channel = str(uuid.uuid4())
    assert clients.is_valid({"type": "message.send", "payload": {"idem_key": "k1", "channel": channel, "text": "hi"}})
    assert clients.is_valid({"type": "register", "payload": {"instance": "w-1", "capability": {"weight": 1.5}}})
    # A server frame from a client, an unknown field, a null optional, a control character, an empty text.
    assert not clients.is_valid({"type": "presence.changed", "payload": {"user": "linh", "state": "online"}})
    assert not clients.is_valid({"type": "heartbeat", "payload": {"instance": "w-1", "extra": 1}})
    assert not clients.is_valid({"type": "register", "payload": {"instance": "w-1", "capability": {"host": None}}})
    assert not clients.is_valid({"type": "deregister", "payload": {"instance": "w\x01"}})
    assert not clients.is_valid({"type": "message.send", "payload": {"idem_key": "k", "channel": channel, "text": ""}})


def test_the_python_client_decodes_every_server_frame_as_the_schema_describes_it(schema):
    for direction, classes in (("ServerFrame", events.SERVER_FRAMES), ("ClientFrame", events.CLIENT_FRAMES)):
        assert set(classes) == frame_types(schema, direction), direction
        for frame_type, cls in classes.items():
            payload = payload_schema(schema, frame_type, direction)
            hints = get_type_hints(cls)
            fields = {field.name: field for field in dataclasses.fields(cls)}
            assert set(fields) == set(payload["properties"]), frame_type
            required = {name for name, field in fields.items() if field.default is dataclasses.MISSING}
            if direction == "ServerFrame":
                # The client requires exactly what the server always sends.
                assert required == set(payload.get("required", ())), frame_type
            else:
                # The client always sends what the server requires (and may send optional fields too).
                assert required >= set(payload.get("required", ())), frame_type
            for name, field in payload["properties"].items():
                assert json_type(hints[name]) == described(field, schema), f"{frame_type}.{name}"


async def test_real_frames_from_a_live_instance_match_the_schema(live_instances, acme, closing):
    (instance,) = live_instances(1)
    linh = await closing(connect(instance, acme, "linh"))
    tuan = await closing(connect(instance, acme, "tuan"))
    channel = str(acme.channels["fleet"].id)
    sent = [
        ("message.send", {"idem_key": "k-1", "channel": channel, "text": "hello"}),
        ("register", {"instance": "w-1", "capability": {"family": "gpu", "weight": 2}}),
        ("deregister", {"instance": "w-1"}),
        ("message.send", {"idem_key": "k-2", "channel": channel}),
    ]
    for frame_type, payload in sent:
        await tuan.send(frame_type, payload)
    await tuan.wait_for(lambda client: client.of_type("error"))
    await tuan.wait_for(lambda client: client.of_type("deregister.ack"))
    await linh.wait_for(lambda client: client.of_type("message.created"))
    await tuan.wait_for(lambda client: client.changes())
    await close_all(linh, tuan)

    schema = Client().get("/v1/schema/frames.json").json()
    servers, clients = validator(schema, "ServerFrame"), validator(schema, "ClientFrame")
    received = linh.frames + tuan.frames
    assert {frame["type"] for frame in received} >= {
        "connection.ack",
        "presence.snapshot",
        "presence.changed",
        "message.ack",
        "message.created",
        "register.ack",
        "deregister.ack",
        "error",
    }
    for frame in received:
        servers.validate(frame)
    for frame_type, payload in sent[:-1]:
        clients.validate({"type": frame_type, "payload": payload})
    # The invalid send the error answered, and a real frame with a field the schema does not list.
    assert not clients.is_valid({"type": sent[-1][0], "payload": sent[-1][1]})
    ack = next(frame for frame in received if frame["type"] == "message.ack")
    assert not servers.is_valid({**ack, "payload": {**ack["payload"], "extra": 1}})
