"""GET /v1/channels/<id>/messages: a channel's history, by seq."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from chat.queries import PAGE_SIZE, is_member, messages_after
from relay.api import Operation, QueryInt, documented, endpoint, get_channel, query_int
from relay.exceptions import ApiError
from relay.frames import MessageCreated

HISTORY_DEFAULT_LIMIT = 100
# The largest seq a PositiveBigIntegerField holds on every backend.
MAX_SEQ = 2**63 - 1
AFTER = QueryInt("after", 0, 0, MAX_SEQ, "the last seq already seen; the page starts after it")
LIMIT = QueryInt("limit", HISTORY_DEFAULT_LIMIT, 1, PAGE_SIZE, "how many messages at most")


@with_config(ConfigDict(extra="forbid"))
class History(TypedDict):
    channel: str
    messages: list[MessageCreated]
    # The `after` of the next page; null once the newest message was reached.
    next_after: int | None


@endpoint("GET", readers=True)
@documented(GET=Operation("A channel's messages after a seq", {200: History}, query=(AFTER, LIMIT), tags=("chat",)))
def channel_messages(request: HttpRequest, channel_id: str) -> HttpResponse:
    """GET /v1/channels/<id>/messages?after=<seq>&limit=<n>: the channel's messages after a seq, in seq order.

    With a connection token, only a channel its user is a member of; any other is a 404, as
    another tenant's is.
    """
    channel = get_channel(request.environment, channel_id)
    if request.reader is not None and not is_member(request.reader, str(channel.id)):
        raise ApiError(404, "channel_not_found", "no such channel")
    after = query_int(request, AFTER)
    limit = query_int(request, LIMIT)
    found = messages_after(str(channel.id), after, limit)
    # A full page may have more behind it; a short one reached the newest message.
    next_after = found[-1]["seq"] if len(found) == limit else None
    return JsonResponse(History(channel=str(channel.id), messages=found, next_after=next_after))
