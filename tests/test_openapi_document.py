"""/v1/openapi.json covers every API route, for exactly the methods its view serves."""

from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from relay import schema
from relay.api import UserBody

# Development routes outside the API the document describes.
UNDOCUMENTED = {"/demo/session"}


def endpoint_routes() -> dict[str, tuple[str, ...]]:
    """Every route served by a relay.api `endpoint` view, with the methods that view allows."""
    found = {}

    def walk(patterns: list, prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern) and hasattr(pattern.callback, "methods"):
                found["/" + prefix + str(pattern.pattern)] = pattern.callback.methods

    walk(get_resolver().url_patterns, "")
    return found


def test_every_api_route_is_documented_with_the_methods_it_serves():
    document = Client().get("/v1/openapi.json").json()
    documented = {
        path.replace("{channel_id}", "<str:channel_id>")
        .replace("{user_id}", "<path:user_id>")
        .replace("{webhook_id}", "<str:webhook_id>"): sorted(method.upper() for method in methods)
        for path, methods in document["paths"].items()
    }
    served = {path: sorted(methods) for path, methods in endpoint_routes().items() if path not in UNDOCUMENTED}
    assert "/v1/channels/<str:channel_id>/members/<path:user_id>" in served
    assert documented == served
    assert set(endpoint_routes()) >= UNDOCUMENTED


def test_a_request_body_is_the_model_the_view_validates_with():
    document = Client().get("/v1/openapi.json").json()
    body = document["paths"]["/v1/users"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    published = document["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    assert published["required"] == ["id"]
    assert set(published["properties"]) == set(UserBody.model_fields)
    assert published["additionalProperties"] is False
    # Optional fields may be left out, never null: the schema says so as the model does.
    assert "anyOf" not in published["properties"]["name"]


def test_the_document_is_built_once_per_process_and_served_the_same_each_time(monkeypatch):
    builds = []
    build = schema.openapi_document

    def counted() -> dict:
        builds.append(1)
        return build()

    monkeypatch.setattr(schema, "openapi_document", counted)
    schema.openapi_body.cache_clear()
    first, second = Client().get("/v1/openapi.json"), Client().get("/v1/openapi.json")
    assert (first.status_code, first["Content-Type"]) == (200, "application/json")
    assert first.content == second.content
    assert first.json()["openapi"] == "3.1.0"
    assert len(builds) == 1
