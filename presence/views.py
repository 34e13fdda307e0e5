"""GET /v1/channels/<id>/presence: the same question as the snapshot, over HTTP, a page at a time."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from presence.reads import online_page
from relay.api import (
    ErrorBody,
    Operation,
    QueryId,
    QueryInt,
    documented,
    endpoint,
    error_response,
    get_channel,
    query_id,
    query_int,
)

MAX_PAGE = 1000
LIMIT = QueryInt("limit", MAX_PAGE, 1, MAX_PAGE, "how many online members at most")
AFTER = QueryId("after", "the last user id of the previous page (its `next_after`); the page starts after it")


@with_config(ConfigDict(extra="forbid"))
class ChannelPresence(TypedDict):
    channel: str
    # The channel's online members after `after`, in id order.
    online: list[str]
    # The `after` of the next page; null once no member is left behind this page.
    next_after: str | None


@endpoint("GET")
@documented(
    GET=Operation(
        "Who of a channel is online, a page at a time",
        {200: ChannelPresence, 503: ErrorBody},
        query=(LIMIT, AFTER),
        tags=("presence",),
    )
)
def channel_presence(request: HttpRequest, channel_id: str) -> HttpResponse:
    """200 `{"channel", "online": [...], "next_after"}`; 404 for an unknown or other tenant's channel."""
    channel = get_channel(request.environment, channel_id)
    limit, after = query_int(request, LIMIT), query_id(request, AFTER)
    page = online_page(channel, after, limit)
    if page is None:
        return error_response(503, "presence_unavailable", "the presence store does not answer; try again")
    online, next_after = page
    return JsonResponse(ChannelPresence(channel=str(channel.id), online=online, next_after=next_after))
