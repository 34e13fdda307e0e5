"""GET /v1/channels/<id>/presence: the same question as the snapshot, over HTTP."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from presence.reads import online_in_channel
from relay.api import ErrorBody, Operation, documented, endpoint, error_response, get_channel


@with_config(ConfigDict(extra="forbid"))
class ChannelPresence(TypedDict):
    channel: str
    online: list[str]


@endpoint("GET")
@documented(GET=Operation("Who of a channel is online", {200: ChannelPresence, 503: ErrorBody}, tags=("presence",)))
def channel_presence(request: HttpRequest, channel_id: str) -> HttpResponse:
    """200 `{"channel", "online": [...]}`; 404 for an unknown or other tenant's channel."""
    channel = get_channel(request.environment, channel_id)
    online = online_in_channel(channel)
    if online is None:
        return error_response(503, "presence_unavailable", "the presence store does not answer; try again")
    return JsonResponse(ChannelPresence(channel=str(channel.id), online=online))
