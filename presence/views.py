"""Presence over HTTP: a channel's online members a page at a time, a user's true presence, setting a status."""

from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, JsonResponse
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from presence import status
from presence.reads import online_flags, online_page
from relay.api import (
    ErrorBody,
    Operation,
    QueryId,
    QueryInt,
    documented,
    endpoint,
    error_response,
    get_channel,
    get_user,
    parse_body,
    query_id,
    query_int,
)
from relay.exceptions import ApiError
from relay.frames import DeviceKind, PresenceSet, PresenceStatus, StatusName, format_instant

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


@with_config(ConfigDict(extra="forbid"))
class ConnectionOut(TypedDict):
    device: DeviceKind
    idle: bool
    connected_at: str


@with_config(ConfigDict(extra="forbid"))
class UserPresence(TypedDict):
    user: str
    state: str
    status: StatusName
    text: str
    emoji: str
    until: str | None
    idle: bool
    invisible: bool
    last_seen_at: str | None
    connections: list[ConnectionOut]


UNAVAILABLE = ("presence_unavailable", "the presence store does not answer; try again")


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
    """200 `{"channel", "online", "next_after"}`, invisible users left out; 404 for an unknown channel."""
    channel = get_channel(request.environment, channel_id)
    limit, after = query_int(request, LIMIT), query_id(request, AFTER)
    page = online_page(channel, after, limit)
    if page is None:
        return error_response(503, *UNAVAILABLE)
    online, next_after = page
    return JsonResponse(ChannelPresence(channel=str(channel.id), online=online, next_after=next_after))


@endpoint("GET")
@documented(
    GET=Operation(
        "A user's true presence, status and connections", {200: UserPresence, 503: ErrorBody}, tags=("presence",)
    )
)
def user_presence(request: HttpRequest, user_id: str) -> HttpResponse:
    """The backend's view: the truth, invisibility included, with each connection's device."""
    user = get_user(request.environment, user_id)
    environment_id = str(request.environment.id)
    flags = online_flags([(environment_id, user.external_id)], op="user_presence")
    connections = status.read_devices(environment_id, user.external_id)
    if flags is None or connections is None:
        return error_response(503, *UNAVAILABLE)
    stored = status.read_statuses(environment_id, [user.external_id]).get(user.external_id, status.Status())
    chosen = stored.effective().out(idle=bool(connections) and all(c["idle"] for c in connections))
    return JsonResponse(
        UserPresence(
            user=user.external_id,
            state="online" if flags[0] else "offline",
            **chosen,
            invisible=stored.invisible,
            last_seen_at=format_instant(stored.last_seen_at),
            connections=connections,
        )
    )


@endpoint("PUT")
@documented(
    PUT=Operation(
        "Set a user's status (told as if the user had sent presence.set)",
        {200: PresenceStatus, 403: ErrorBody},
        body=PresenceSet,
        tags=("presence",),
    )
)
def user_status(request: HttpRequest, user_id: str) -> HttpResponse:
    """200 with the status; 400 for a bad body, 403 `forbidden` for invisibility the environment does not allow."""
    user = get_user(request.environment, user_id)
    body = parse_body(request, PresenceSet)
    try:
        stored, idle = async_to_sync(status.set_status)(str(request.environment.id), user, body)
    except status.Forbidden:
        raise ApiError(403, "forbidden", "this environment does not allow invisibility") from None
    return JsonResponse(PresenceStatus(user=user.external_id, **stored.out(idle), invisible=stored.invisible))
