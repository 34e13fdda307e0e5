"""The demo web client (`/`) and its dev-only sign-in (`POST /demo/session`).

The sign-in mints a connection token for any user of the `local` environment that
`make run` creates, without a password: it exists only when DEBUG or RELAY_DEMO is
on, and answers 404 otherwise.
"""

from django.db.models import Count, Prefetch, prefetch_related_objects
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from relay.api import channel_json, endpoint, get_user, parse_body, user_json
from relay.exceptions import ApiError
from relay.frames import Identifier, StrictModel
from relay.models import Channel, User
from relay.tokens import mint_token
from web.demo import demo_enabled, demo_environment

# A working day: the page stops reconnecting on 4401, so a short token would sign
# a demo out in the middle of a session.
DEMO_TOKEN_TTL_SECONDS = 8 * 3600

# Message text and names are untrusted; the client only ever writes them with
# textContent, and this policy makes any slip inert: no inline script, nothing
# loaded or connected to outside this origin.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class DemoSessionBody(StrictModel):
    user: Identifier


@require_safe
def index(request: HttpRequest) -> HttpResponse:
    """The client page; it lists the demo users to sign in as when the demo is on."""
    enabled = demo_enabled()
    environment = demo_environment() if enabled else None
    users = list(environment.users.order_by("external_id")) if environment else []
    context = {"demo_enabled": enabled, "environment": environment, "users": users}
    response = render(request, "web/index.html", context)
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


@endpoint("POST", authenticated=False)
def demo_session(request: HttpRequest) -> HttpResponse:
    """POST /demo/session `{"user"}`: a token and the user's channels with their members."""
    if not demo_enabled():
        raise ApiError(404, "not_found", "the demo sign-in is off (set DEBUG=1 or RELAY_DEMO=1)")
    body = parse_body(request, DemoSessionBody)
    environment = demo_environment()
    if environment is None:
        raise ApiError(404, "environment_not_found", "no 'local' environment: run `python manage.py setupdemo`")
    user = get_user(environment, body.user)
    token, expires_at = mint_token(environment, user.external_id, DEMO_TOKEN_TTL_SECONDS)
    # Selected through a subquery: a filter on memberships would also narrow the count to the user's own.
    channels = list(
        Channel.objects.filter(environment=environment, id__in=user.memberships.values("channel_id"))
        .annotate(member_count=Count("memberships"))
        .order_by("name", "id")
    )
    # A large channel's people are counted, not named (docs/contract.md, Large rooms): the page
    # shows its online count, so its members, thousands of them, are not read at all.
    large = {channel.id for channel in channels if channel.member_count > environment.large_room_members}
    small = [channel for channel in channels if channel.id not in large]
    prefetch_related_objects(small, Prefetch("members", queryset=User.objects.order_by("external_id")))
    return JsonResponse(
        {
            "token": token,
            "expires_at": expires_at.isoformat(),
            "user": user_json(user),
            "channels": [session_channel_json(channel, channel.id in large) for channel in channels],
        }
    )


def session_channel_json(channel: Channel, large: bool) -> dict:
    """A channel of the session: `large`, `member_count`, and `members` unless it is large."""
    members = [] if large else [user_json(member) for member in channel.members.all()]
    return {**channel_json(channel), "large": large, "member_count": channel.member_count, "members": members}
