"""POST/GET /v1/webhooks and DELETE /v1/webhooks/<id> (docs/contract.md, Webhooks)."""

import uuid
from typing import Annotated

from django.http import HttpRequest, HttpResponse, JsonResponse
from pydantic import ConfigDict, Field, field_validator, with_config
from typing_extensions import TypedDict

from relay.api import Operation, documented, endpoint, parse_body
from relay.exceptions import ApiError
from relay.frames import StrictModel
from webhooks import addresses, events
from webhooks.models import Endpoint

MAX_URL_LENGTH = 2048
EventName = Annotated[str, Field(min_length=1, max_length=64)]


class WebhookBody(StrictModel):
    url: Annotated[str, Field(min_length=1, max_length=MAX_URL_LENGTH)]
    events: Annotated[list[EventName], Field(min_length=1, max_length=len(events.EVENT_TYPES))]

    @field_validator("events")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        if value == ["*"]:
            return value
        unknown = [name for name in value if name not in events.EVENT_TYPES]
        if unknown:
            raise ValueError(f'unknown event {unknown[0]!r}: use ["*"] or names from {", ".join(events.EVENT_TYPES)}')
        return list(dict.fromkeys(value))


@with_config(ConfigDict(extra="forbid"))
class WebhookOut(TypedDict):
    id: str
    url: str
    events: list[str]


@with_config(ConfigDict(extra="forbid"))
class WebhookCreated(TypedDict):
    id: str
    url: str
    events: list[str]
    # Shown once: the receiver verifies signatures with it.
    secret: str


@with_config(ConfigDict(extra="forbid"))
class WebhookList(TypedDict):
    webhooks: list[WebhookOut]


def webhook_json(found: Endpoint) -> WebhookOut:
    return WebhookOut(id=str(found.id), url=found.url, events=list(found.events))


@endpoint("GET", "POST")
@documented(
    GET=Operation("List the environment's webhook endpoints (without secrets)", {200: WebhookList}, tags=("webhooks",)),
    POST=Operation(
        "Create a webhook endpoint; its secret is shown once",
        {201: WebhookCreated},
        body=WebhookBody,
        tags=("webhooks",),
    ),
)
def webhooks(request: HttpRequest) -> HttpResponse:
    """GET lists the environment's endpoints; POST creates one and shows its secret, once."""
    if request.method == "GET":
        found = Endpoint.objects.filter(environment=request.environment).order_by("created_at", "id")
        return JsonResponse({"webhooks": [webhook_json(item) for item in found]})
    body = parse_body(request, WebhookBody)
    try:
        addresses.check_url(body.url)
    except addresses.RefusedUrl as refused:
        raise ApiError(400, "invalid_request", str(refused)) from None
    created = Endpoint.objects.create(environment=request.environment, url=body.url, events=body.events)
    return JsonResponse(WebhookCreated(**webhook_json(created), secret=created.secret), status=201)


@endpoint("DELETE")
@documented(DELETE=Operation("Delete a webhook endpoint", {204: None}, tags=("webhooks",)))
def webhook(request: HttpRequest, webhook_id: str) -> HttpResponse:
    """DELETE removes one endpoint of the environment, with its deliveries (404: unknown or another tenant's)."""
    try:
        found = Endpoint.objects.get(environment=request.environment, id=uuid.UUID(webhook_id))
    except (ValueError, Endpoint.DoesNotExist):
        raise ApiError(404, "webhook_not_found", "no such webhook") from None
    found.delete()
    return HttpResponse(status=204)
