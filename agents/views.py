"""GET /v1/agents: the key's environment's registrations, optionally filtered by capability."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from pydantic import ConfigDict, ValidationError, with_config
from typing_extensions import TypedDict

from agents.queries import Agent, registration_json, registrations_of
from relay.api import Operation, documented, endpoint
from relay.exceptions import ApiError
from relay.frames import Identifier, StrictModel, describe_validation_error


class AgentFilters(StrictModel):
    """The query string: each capability filter at most once, an exact match, strings as in `register`."""

    family: Identifier | None = None
    cognition: Identifier | None = None
    host: Identifier | None = None


def parse_filters(request: HttpRequest) -> AgentFilters:
    """Return the validated filters, or raise a 400 ApiError naming the bad parameter."""
    given = {}
    for name, values in request.GET.lists():
        if len(values) > 1:
            raise ApiError(400, "invalid_query", f"{name}: give it at most once")
        given[name] = values[0]
    try:
        return AgentFilters.model_validate(given)
    except ValidationError as error:
        raise ApiError(400, "invalid_query", describe_validation_error(error)) from None


@with_config(ConfigDict(extra="forbid"))
class AgentList(TypedDict):
    agents: list[Agent]


@endpoint("GET")
@documented(GET=Operation("Agent registrations, oldest first", {200: AgentList}, query=AgentFilters, tags=("agents",)))
def agents(request: HttpRequest) -> HttpResponse:
    """GET /v1/agents[?family=&cognition=&host=]: registrations, oldest first."""
    filters = parse_filters(request).model_dump(exclude_none=True)
    rows = registrations_of(request.environment, **filters)
    return JsonResponse(AgentList(agents=[registration_json(row) for row in rows]))
