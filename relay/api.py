"""The HTTP API (docs/contract.md, 2. HTTP API): parse, call one function, answer.

Every management call carries `Authorization: Bearer <api_key>` and acts inside
that key's environment; an object in another environment answers 404, never 403.
Each view says what it reads and answers with `documented`; relay.schema builds
/v1/openapi.json from exactly those models.
"""

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Annotated, Any, Literal, TypeVar

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from relay import membership, rate_limits
from relay.exceptions import ApiError, InvalidToken, LimitReached
from relay.frames import DisplayName, Identifier, StrictModel, describe_validation_error
from relay.models import API_KEY_PREFIX, ApiKey, Channel, Environment, User, hash_api_key
from relay.tokens import DEFAULT_TTL_SECONDS, mint_token, verify_token

logger = logging.getLogger(__name__)

View = Callable[..., HttpResponse]
M = TypeVar("M", bound=BaseModel)


class UserBody(StrictModel):
    id: Identifier
    name: DisplayName = ""


class ChannelBody(StrictModel):
    name: Identifier
    type: Literal["public", "private"] = "public"


class TokenBody(StrictModel):
    user: Identifier
    # At most RELAY_MAX_TOKEN_TTL_S, checked by the view: the cap is the operator's, not the schema's.
    ttl_seconds: Annotated[int, Field(ge=1)] = DEFAULT_TTL_SECONDS


# ── what the views answer ────────────────────────────────────────────────────
@with_config(ConfigDict(extra="forbid"))
class ErrorDetail(TypedDict):
    code: str
    message: str


@with_config(ConfigDict(extra="forbid"))
class ErrorBody(TypedDict):
    error: ErrorDetail


@with_config(ConfigDict(extra="forbid"))
class UserOut(TypedDict):
    id: str
    name: str


@with_config(ConfigDict(extra="forbid"))
class ChannelOut(TypedDict):
    id: str
    name: str
    type: Literal["public", "private"]


@with_config(ConfigDict(extra="forbid"))
class ChannelList(TypedDict):
    channels: list[ChannelOut]


@with_config(ConfigDict(extra="forbid"))
class MemberOut(TypedDict):
    channel: str
    user: str


@with_config(ConfigDict(extra="forbid"))
class TokenOut(TypedDict):
    token: str
    expires_at: str


@dataclass(frozen=True)
class QueryInt:
    """A whole-number query parameter: read by `query_int`, published by relay.schema."""

    name: str
    default: int
    minimum: int
    maximum: int
    description: str = ""


@dataclass(frozen=True)
class QueryId:
    """An id query parameter (a user's, as paths name them), optional: read by `query_id`, published by relay.schema."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class Operation:
    """One method of a view as /v1/openapi.json describes it.

    `responses` maps a status to its body's type (a model or TypedDict; None: no body, `str`:
    plain text). The 400, 401 and 404 answers that `endpoint`, `parse_body`, `query_int` and the
    path lookups give are added by relay.schema; list only the others.
    """

    summary: str
    responses: Mapping[int, Any]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | tuple[QueryInt | QueryId, ...] = ()
    tags: tuple[str, ...] = ()


def documented(**operations: Operation) -> Callable[[View], View]:
    """Attach each method's Operation (keyword: the method) to a view, under `endpoint`."""

    def attach(view: View) -> View:
        view.operations = operations
        return view

    return attach


def error_response(status: int, code: str, message: str) -> JsonResponse:
    """Return the contract's `{"error": {"code", "message"}}` body."""
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def bearer(request: HttpRequest) -> str:
    """The request's `Authorization: Bearer` credential, or raise a 401 ApiError."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "unauthorized", "send Authorization: Bearer <api key>")
    return secret.strip()


def authenticate(request: HttpRequest) -> Environment:
    """Return the environment of the request's API key, or raise a 401 ApiError."""
    key = ApiKey.objects.active().select_related("environment").filter(digest=hash_api_key(bearer(request))).first()
    if key is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key")
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    request.api_key_id = key.pk
    return key.environment


def authenticate_reader(request: HttpRequest) -> tuple[Environment, User | None]:
    """The environment of an API key (user None), or of a connection token and the user it names.

    Clients hold a connection token, never an API key: with one they may read what their socket
    would have delivered to them (a channel's history, to fill a gap), and nothing else.
    """
    secret = bearer(request)
    if secret.startswith(API_KEY_PREFIX):
        return authenticate(request), None
    try:
        user = verify_token(secret)
    except InvalidToken:
        raise ApiError(401, "unauthorized", "unknown or revoked API key, or an invalid connection token") from None
    return user.environment, user


def endpoint(*methods: str, authenticated: bool = True, readers: bool = False) -> Callable[[View], View]:
    """Wrap a view: allowed methods, authentication and JSON errors.

    `authenticated`: an API key is required (`request.environment`). `readers`: a member's
    connection token is accepted too (`request.reader` is its user; None with an API key).
    """

    def decorate(view: View) -> View:
        # relay.schema reads what the wrapper enforces: its methods and whose credential it takes.
        view.methods = methods
        view.auth = "reader" if readers else "api_key" if authenticated else None

        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error_response(405, "method_not_allowed", f"use {' or '.join(methods)}")
                response["Allow"] = ", ".join(methods)
                return response
            try:
                if readers:
                    request.environment, request.reader = authenticate_reader(request)
                elif authenticated:
                    request.environment = authenticate(request)
                return view(request, *args, **kwargs)
            except ApiError as error:
                response = error_response(error.status, error.code, error.message)
                for header, value in error.headers.items():
                    response[header] = value
                return response

        return wrapper

    return decorate


def parse_body(request: HttpRequest, schema: type[M]) -> M:
    """Return the request's JSON body validated against `schema`, or raise a 400 ApiError."""
    try:
        # orjson, as for frames: strict JSON, nesting cut at 1,024 levels, no lone surrogates and
        # no integer of thousands of digits (json.loads let each through or raised something else).
        data = orjson.loads(request.body or b"")
    except orjson.JSONDecodeError:
        raise ApiError(400, "invalid_json", "the body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_body", "the body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        raise ApiError(400, "invalid_body", describe_validation_error(error)) from None


def get_channel(environment: Environment, channel_id: str) -> Channel:
    """Return the environment's channel, or raise 404 (also for another tenant's)."""
    try:
        return Channel.objects.get(environment=environment, id=uuid.UUID(channel_id))
    except (ValueError, Channel.DoesNotExist):
        raise ApiError(404, "channel_not_found", "no such channel") from None


user_ids = TypeAdapter(Identifier)


def get_user(environment: Environment, user_id: str) -> User:
    """Return the environment's user, or raise 404 (also for another tenant's, or an id no user can have)."""
    try:
        # Checked first: a NUL in a path reaches the query otherwise, and PostgreSQL refuses it.
        user_ids.validate_python(user_id)
        return User.objects.get(environment=environment, external_id=user_id)
    except (ValidationError, User.DoesNotExist):
        raise ApiError(404, "user_not_found", "no such user") from None


def query_id(request: HttpRequest, parameter: QueryId) -> str | None:
    """Return the query parameter as an id (None when absent), or raise a 400 ApiError."""
    values = request.GET.getlist(parameter.name)
    if not values:
        return None
    if len(values) > 1:
        raise ApiError(400, "invalid_query", f"{parameter.name}: give it at most once")
    try:
        return user_ids.validate_python(values[0])
    except ValidationError as error:
        raise ApiError(400, "invalid_query", f"{parameter.name}: {describe_validation_error(error)}") from None


def query_int(request: HttpRequest, parameter: QueryInt) -> int:
    """Return the query parameter as a whole number in its range, or raise a 400 ApiError."""
    name, minimum, maximum = parameter.name, parameter.minimum, parameter.maximum
    raw = request.GET.get(name)
    if raw is None:
        return parameter.default
    # isdecimal() alone takes non-ASCII digits, which int() would then accept.
    if raw.isascii() and raw.isdecimal() and len(raw) <= len(str(maximum)) and minimum <= int(raw) <= maximum:
        return int(raw)
    raise ApiError(400, "invalid_query", f"{name} must be a whole number from {minimum} to {maximum}")


def user_json(user: User) -> UserOut:
    return UserOut(id=user.external_id, name=user.name)


def channel_json(channel: Channel) -> ChannelOut:
    return ChannelOut(id=str(channel.id), name=channel.name, type=channel.type)


@endpoint("POST")
@documented(POST=Operation("Create or update a user", {201: UserOut, 200: UserOut}, body=UserBody, tags=("users",)))
def users(request: HttpRequest) -> HttpResponse:
    """POST /v1/users: create or update a user (201 created, 200 existed)."""
    body = parse_body(request, UserBody)
    user, created = User.objects.update_or_create(
        environment=request.environment, external_id=body.id, defaults={"name": body.name}
    )
    return JsonResponse(user_json(user), status=201 if created else 200)


@endpoint("GET", "POST")
@documented(
    GET=Operation("List the environment's channels", {200: ChannelList}, tags=("channels",)),
    POST=Operation("Create a channel", {201: ChannelOut}, body=ChannelBody, tags=("channels",)),
)
def channels(request: HttpRequest) -> HttpResponse:
    """GET /v1/channels lists the environment's channels; POST creates one."""
    if request.method == "GET":
        found = Channel.objects.filter(environment=request.environment).order_by("name", "id")
        return JsonResponse({"channels": [channel_json(channel) for channel in found]})
    body = parse_body(request, ChannelBody)
    channel = Channel.objects.create(environment=request.environment, name=body.name, type=body.type)
    return JsonResponse(channel_json(channel), status=201)


@endpoint("PUT", "DELETE")
@documented(
    PUT=Operation("Add a member (live)", {201: MemberOut, 200: MemberOut, 409: ErrorBody}, tags=("channels",)),
    DELETE=Operation("Remove a member (live)", {204: None}, tags=("channels",)),
)
def member(request: HttpRequest, channel_id: str, user_id: str) -> HttpResponse:
    """PUT adds a member (201, or 200 when already one); DELETE removes one (204)."""
    channel = get_channel(request.environment, channel_id)
    user = get_user(request.environment, user_id)
    if request.method == "PUT":
        try:
            added = membership.add_member(channel, user, capped=True)
        except LimitReached as reached:
            raise ApiError(409, "limit_reached", str(reached)) from None
        return JsonResponse(MemberOut(channel=str(channel.id), user=user.external_id), status=201 if added else 200)
    membership.remove_member(channel, user)
    return HttpResponse(status=204)


@endpoint("POST")
@documented(
    POST=Operation(
        "Mint a connection token", {201: TokenOut, 404: ErrorBody, 429: ErrorBody}, body=TokenBody, tags=("tokens",)
    )
)
def tokens(request: HttpRequest) -> HttpResponse:
    """POST /v1/tokens: mint a connection token for one of the environment's users."""
    if (wait_ms := rate_limits.tokens().refused(request.api_key_id)) is not None:
        # Whole seconds, rounded up: Retry-After takes no fractions.
        retry_after = str(-(-wait_ms // 1000))
        raise ApiError(429, "rate_limited", "too many tokens minted with this key", {"Retry-After": retry_after})
    body = parse_body(request, TokenBody)
    if body.ttl_seconds > settings.RELAY_MAX_TOKEN_TTL_S:
        raise ApiError(400, "invalid_request", f"ttl_seconds must be at most {settings.RELAY_MAX_TOKEN_TTL_S}")
    user = get_user(request.environment, body.user)
    token, expires_at = mint_token(request.environment, user.external_id, body.ttl_seconds)
    return JsonResponse(TokenOut(token=token, expires_at=expires_at.isoformat()), status=201)


# ── the environment's presence settings ──────────────────────────────────────
# A member count no channel can exceed: the settings only compare against real rooms.
MAX_MEMBERS_SETTING = 1_000_000
MemberCount = Annotated[int, Field(ge=1, le=MAX_MEMBERS_SETTING)]


class SettingsBody(StrictModel):
    """PATCH /v1/settings: any subset of the environment's presence settings."""

    allow_invisible: bool | None = None
    share_last_seen: bool | None = None
    large_room_members: MemberCount | None = None
    signal_max_members: MemberCount | None = None


@with_config(ConfigDict(extra="forbid"))
class SettingsOut(TypedDict):
    allow_invisible: bool
    share_last_seen: bool
    large_room_members: int
    signal_max_members: int


SETTINGS_FIELDS = tuple(SettingsOut.__annotations__)


def settings_json(environment: Environment) -> SettingsOut:
    return SettingsOut(**{name: getattr(environment, name) for name in SETTINGS_FIELDS})


@endpoint("GET", "PATCH")
@documented(
    GET=Operation("The environment's presence settings", {200: SettingsOut}, tags=("settings",)),
    PATCH=Operation(
        "Change some of the environment's presence settings", {200: SettingsOut}, body=SettingsBody, tags=("settings",)
    ),
)
def environment_settings(request: HttpRequest) -> HttpResponse:
    """GET the environment's settings; PATCH changes the fields given (400 `invalid_request` for a bad value)."""
    environment = request.environment
    if request.method == "PATCH":
        try:
            body = parse_body(request, SettingsBody)
        except ApiError as error:
            raise ApiError(400, "invalid_request", error.message) from None
        changed = {name: getattr(body, name) for name in body.model_fields_set}
        if changed:
            Environment.objects.filter(pk=environment.pk).update(**changed)
            for name, value in changed.items():
                setattr(environment, name, value)
    return JsonResponse(settings_json(environment))
