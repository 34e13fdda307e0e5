"""The machine-readable descriptions: /v1/openapi.json and /v1/schema/frames.json.

Both are generated, on each request, from what the code validates with and sends: the OpenAPI
document from the URL routes and the Operations their views carry (relay.api.documented), the
frames' JSON Schema from the registry (every client frame's model, every server frame's
TypedDict). Nothing here is a copy that could drift from the code.
"""

import functools
import http
import inspect
import re
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, get_resolver
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from relay import registry
from relay.api import ErrorBody, Operation, QueryId, QueryInt, View, documented, endpoint
from relay.frames import ChannelId, Identifier

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# What the path parameters of every route are; the views look them up with the same rules
# (relay.api.get_channel, get_user), and anything else is their 404.
PATH_PARAMETERS: dict[str, Any] = {"channel_id": ChannelId, "user_id": Identifier, "webhook_id": ChannelId}
SECURITY = {
    "api_key": [{"apiKey": []}],
    "reader": [{"apiKey": []}, {"connectionToken": []}],
    None: [],
}


# ── OpenAPI ──────────────────────────────────────────────────────────────────
def documented_routes() -> Iterator[tuple[str, View]]:
    """Every routed view that carries Operations, with its OpenAPI path (`/v1/channels/{channel_id}`)."""

    def walk(patterns: list, prefix: str) -> Iterator[tuple[str, View]]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern) and getattr(pattern.callback, "operations", None):
                route = prefix + str(pattern.pattern)
                yield "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route), pattern.callback

    yield from walk(get_resolver().url_patterns, "")


class Schemas:
    """The types an API document names, generated together so shared ones become one component."""

    def __init__(self) -> None:
        self.inputs: dict[tuple[Any, JsonSchemaMode], TypeAdapter] = {}

    def add(self, kind: Any, mode: JsonSchemaMode) -> tuple[Any, JsonSchemaMode]:
        self.inputs.setdefault((kind, mode), TypeAdapter(kind))
        return kind, mode

    def generate(self, ref_template: str) -> tuple[dict, dict]:
        """The schema of each added type (usually a $ref), and the definitions they refer to."""
        keyed, top = TypeAdapter.json_schemas(
            [(key, key[1], adapter) for key, adapter in self.inputs.items()], ref_template=ref_template
        )
        return {key: value for (key, _), value in keyed.items()}, top.get("$defs", {})


def openapi_document() -> dict:
    """The OpenAPI 3.1 document of every documented route."""
    schemas = Schemas()
    # Every error answer's body, added to operations below, after the schemas are generated.
    schemas.add(ErrorBody, "serialization")
    planned = []
    for path, view in documented_routes():
        names = re.findall(r"{(\w+)}", path)
        for name in names:
            schemas.add(PATH_PARAMETERS[name], "validation")
        for method, operation in view.operations.items():
            if operation.body is not None:
                schemas.add(operation.body, "validation")
            for body in operation.responses.values():
                if body not in (None, str):
                    schemas.add(body, "serialization")
            planned.append((path, names, view, method, operation))
    generated, components = schemas.generate("#/components/schemas/{model}")

    paths: dict[str, dict] = {}
    for path, names, view, method, operation in planned:
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": generated[(PATH_PARAMETERS[name], "validation")]}
            for name in names
        ]
        parameters += query_parameters(operation, generated)
        statuses: dict[int, Any] = dict(operation.responses)
        # The answers relay.api gives every view of this kind, in the contract's error body.
        if view.auth is not None:
            statuses.setdefault(401, ErrorBody)
        if operation.body is not None or operation.query:
            statuses.setdefault(400, ErrorBody)
        if names:
            statuses.setdefault(404, ErrorBody)
        entry: dict[str, Any] = {
            "operationId": f"{method.lower()}_{view.__name__}",
            "summary": operation.summary,
            "description": inspect.cleandoc(view.__doc__ or ""),
            "tags": list(operation.tags),
            "security": SECURITY[view.auth],
            "parameters": parameters,
            "responses": {str(status): response(status, body, generated) for status, body in sorted(statuses.items())},
        }
        if operation.body is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": generated[(operation.body, "validation")]}},
            }
        paths.setdefault(path, {})[method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": JSON_SCHEMA_DIALECT,
        "info": {
            "title": "Relay HTTP API",
            "version": "v1",
            "description": (
                "JSON in and out. Management calls carry `Authorization: Bearer <api_key>` and act inside "
                "that key's environment; anything in another environment is a 404. Errors are "
                '`{"error": {"code", "message"}}`; a method a path does not serve is a 405 with `Allow`. '
                "The WebSocket frames are described by /v1/schema/frames.json."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "an environment's API key"},
                "connectionToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "a member's connection token: reads what its socket would deliver",
                },
            },
        },
    }


def query_parameters(operation: Operation, generated: dict) -> list[dict]:
    """The query parameters of an Operation: a model's fields, or QueryInt parameters."""
    if isinstance(operation.query, type) and issubclass(operation.query, BaseModel):
        schema = operation.query.model_json_schema()
        required = set(schema.get("required", ()))
        return [
            {"name": name, "in": "query", "required": name in required, "schema": field}
            for name, field in schema["properties"].items()
        ]
    return [
        integer_parameter(parameter) if isinstance(parameter, QueryInt) else id_parameter(parameter)
        for parameter in operation.query
    ]


def id_parameter(parameter: QueryId) -> dict:
    """The OpenAPI parameter of a QueryId: optional, an id as `query_id` validates it."""
    return {
        "name": parameter.name,
        "in": "query",
        "required": False,
        "description": parameter.description,
        "schema": TypeAdapter(Identifier).json_schema(),
    }


def integer_parameter(parameter: QueryInt) -> dict:
    """The OpenAPI parameter of a QueryInt: the range and default `query_int` enforces."""
    return {
        "name": parameter.name,
        "in": "query",
        "required": False,
        "description": parameter.description,
        "schema": {
            "type": "integer",
            "minimum": parameter.minimum,
            "maximum": parameter.maximum,
            "default": parameter.default,
        },
    }


def response(status: int, body: Any, generated: dict) -> dict:
    """The OpenAPI response of one status: JSON of its body's type, plain text, or no body."""
    answer: dict[str, Any] = {"description": http.HTTPStatus(status).phrase}
    if body is str:
        answer["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif body is not None:
        answer["content"] = {"application/json": {"schema": generated[(body, "serialization")]}}
    return answer


# ── WebSocket frames ─────────────────────────────────────────────────────────
def frames_document() -> dict:
    """The JSON Schema of every frame: `ClientFrame` (client → server) and `ServerFrame` (server → client)."""
    schemas = Schemas()
    client = {name: schemas.add(route.schema, "validation") for name, route in sorted(registry.frames.items())}
    server = {name: schemas.add(payload, "serialization") for name, payload in sorted(registry.server_frames.items())}
    generated, definitions = schemas.generate("#/$defs/{model}")
    both_ways = set(client) & set(server)
    for direction, frames in (("ClientFrame", client), ("ServerFrame", server)):
        names = {name: f"{direction}.{name}" if name in both_ways else name for name in frames}
        for name, key in frames.items():
            definitions[names[name]] = {
                "title": names[name],
                "type": "object",
                "properties": {"type": {"const": name}, "payload": generated[key]},
                "required": ["type", "payload"],
                "additionalProperties": False,
            }
        definitions[direction] = {"oneOf": [{"$ref": f"#/$defs/{names[name]}"} for name in frames]}
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "Relay WebSocket frames",
        "description": (
            'Every frame, both ways, is a JSON text message {"type", "payload"}. ClientFrame: what a client '
            "may send; ServerFrame: what the server sends. A frame's definition is named by its type; a type "
            'sent both ways (signal) has "ClientFrame.<type>" and "ServerFrame.<type>".'
        ),
        "oneOf": [{"$ref": "#/$defs/ClientFrame"}, {"$ref": "#/$defs/ServerFrame"}],
        "$defs": definitions,
    }


# ── the views ────────────────────────────────────────────────────────────────
@endpoint("GET", authenticated=False)
@documented(GET=Operation("This document", {200: dict[str, Any]}, tags=("schemas",)))
def openapi(request: HttpRequest) -> HttpResponse:
    """GET /v1/openapi.json: OpenAPI 3.1 of the HTTP API."""
    return HttpResponse(openapi_body(), content_type="application/json")


@functools.cache
def openapi_body() -> bytes:
    """The document as served, built once per process.

    The routes and models it describes are fixed while the process runs, and building it costs
    tens of milliseconds: a request must not pay that each time.
    """
    return JsonResponse(openapi_document()).content


@endpoint("GET", authenticated=False)
@documented(GET=Operation("JSON Schema of every WebSocket frame", {200: dict[str, Any]}, tags=("schemas",)))
def frames(request: HttpRequest) -> HttpResponse:
    """GET /v1/schema/frames.json: JSON Schema of every WebSocket frame, both directions."""
    return JsonResponse(frames_document())
