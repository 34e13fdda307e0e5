"""The wire schema (docs/contract.md, 3. WebSocket): every frame's payload, both ways, in one place.

Client payloads are strict models. Strict means: unknown fields, missing fields, wrong JSON
types (no coercion of "1" to 1), `null` where a value is expected, empty or over-long strings
and control characters are all refused. Server payloads are TypedDicts: the server builds its
frames with them at no cost on the hot path, and /v1/schema/frames.json is generated from both
(relay.schema). The owning app binds each type to its handler, or declares the frames it sends,
through `relay.registry`; this module only says what a well-formed payload is.
"""

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, NotRequired

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator, with_config

# pydantic reads TypedDicts from typing_extensions before Python 3.12.
from typing_extensions import TypedDict

MAX_ID_LENGTH = 128
MAX_TEXT_LENGTH = 16_384


def _no_control_characters(value: str) -> str:
    if any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in value):
        raise ValueError("must not contain control characters")
    return value


def _no_nul(value: str) -> str:
    # PostgreSQL cannot store NUL in text; refused on every backend so a message that
    # SQLite would keep is not lost on the production database.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _canonical_uuid(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValueError("must be a UUID") from None


# The validators' rules as JSON Schema patterns, for the published schemas (relay.schema).
NO_CONTROL_CHARACTERS = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
NO_NUL = "^[^\\u0000]*$"

Identifier = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID_LENGTH, json_schema_extra={"pattern": NO_CONTROL_CHARACTERS}),
    AfterValidator(_no_control_characters),
]
# Any form uuid.UUID reads (32 hex digits, with or without hyphens); published as the canonical one.
ChannelId = Annotated[
    str, Field(min_length=32, max_length=36, json_schema_extra={"format": "uuid"}), AfterValidator(_canonical_uuid)
]
DisplayName = Annotated[
    str,
    Field(max_length=200, json_schema_extra={"pattern": NO_CONTROL_CHARACTERS}),
    AfterValidator(_no_control_characters),
]
MessageText = Annotated[
    str,
    Field(min_length=1, max_length=MAX_TEXT_LENGTH, json_schema_extra={"pattern": NO_NUL}),
    AfterValidator(_no_nul),
]


def _omitted_not_null(schema: dict[str, Any]) -> None:
    # An optional field of a strict model may be left out but never be null (`_no_nulls`):
    # the published schema says so instead of pydantic's `anyOf [..., null]` with `default: null`.
    for prop in schema.get("properties", {}).values():
        if isinstance(prop.get("default"), dict):
            prop["default"] = {key: value for key, value in prop["default"].items() if value is not None}
        choices = prop.get("anyOf")
        if choices and {"type": "null"} in choices and prop.get("default", ...) is None:
            del prop["default"]
            rest = [choice for choice in choices if choice != {"type": "null"}]
            if len(rest) == 1:
                del prop["anyOf"]
                prop.update(rest[0])
            else:
                prop["anyOf"] = rest


class StrictModel(BaseModel):
    """Refuses unknown fields, coercion and explicit nulls; an optional field is one that may be omitted."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, json_schema_extra=_omitted_not_null)

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None:
                    raise ValueError(f"{key} must not be null")
        return data


class Envelope(StrictModel):
    """`{"type": "...", "payload": {...}}`, the shape of every frame both ways."""

    type: Annotated[str, Field(min_length=1, max_length=64)]
    # Any JSON value here: whether it is the right object is the frame type's schema's call,
    # so a non-object payload of a known type gets that family's error code (`invalid_payload`
    # for the agent families), like any other payload of the wrong shape.
    payload: Any


# ── client → server ──────────────────────────────────────────────────────────
class MessageSend(StrictModel):
    idem_key: Identifier
    channel: ChannelId
    text: MessageText


MAX_SIGNAL_NAME_LENGTH = 32
MAX_SIGNAL_DATA_BYTES = 256


def _small_json(value: dict[str, Any]) -> dict[str, Any]:
    # Measured as the server relays it: compact JSON, UTF-8 (orjson writes the frames).
    try:
        size = len(orjson.dumps(value))
    except TypeError:
        raise ValueError("must be a JSON object") from None
    if size > MAX_SIGNAL_DATA_BYTES:
        raise ValueError(f"must be at most {MAX_SIGNAL_DATA_BYTES} bytes as JSON")
    return value


SignalName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_SIGNAL_NAME_LENGTH, json_schema_extra={"pattern": NO_CONTROL_CHARACTERS}),
    AfterValidator(_no_control_characters),
]
SignalData = Annotated[
    dict[str, Any],
    Field(json_schema_extra={"description": f"any JSON object, at most {MAX_SIGNAL_DATA_BYTES} bytes as compact JSON"}),
    AfterValidator(_small_json),
]


class SignalSend(StrictModel):
    """`signal` from a client: relayed to the channel's other members, never stored."""

    channel: ChannelId
    name: SignalName
    data: SignalData | None = None


class Resume(StrictModel):
    """`resume`: the cursor, as the first frame of a connection opened with `resume=frame`."""

    cursor: dict[ChannelId, Annotated[int, Field(ge=0, strict=True)]]


class Capability(StrictModel):
    """Enrolment attributes of an agent instance; never used for routing."""

    cognition: Identifier | None = None
    weight: Annotated[float, Field(allow_inf_nan=False)] | None = None
    family: Identifier | None = None
    host: Identifier | None = None


class Register(StrictModel):
    instance: Identifier
    capability: Capability = Capability()


class Heartbeat(StrictModel):
    instance: Identifier


class Deregister(StrictModel):
    instance: Identifier


# ── rich presence (docs/contract.md, Rich presence) ─────────────────────────
MAX_STATUS_TEXT = 140
MAX_STATUS_EMOJI = 32
MAX_QUERY_USERS = 100

StatusName = Literal["available", "away", "busy", "dnd"]
DeviceKind = Literal["web", "mobile", "desktop", "bot"]


def _printable(max_length: int) -> Any:
    # "" is allowed: it clears the field.
    return Annotated[
        str,
        Field(max_length=max_length, json_schema_extra={"pattern": NO_CONTROL_CHARACTERS}),
        AfterValidator(_no_control_characters),
    ]


def parse_instant(value: str) -> datetime:
    """An ISO-8601 instant with a UTC offset (a naive time would depend on the server's zone)."""
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an ISO-8601 time") from None
    if instant.tzinfo is None:
        raise ValueError("must carry a UTC offset (Z or +hh:mm)")
    return instant.astimezone(UTC)


def format_instant(instant: datetime | None) -> str | None:
    """An instant as the wire carries it: ISO-8601 in UTC with milliseconds, or None."""
    if instant is None:
        return None
    return instant.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _future_instant(value: str) -> str:
    instant = parse_instant(value)
    if instant <= datetime.now(UTC):
        raise ValueError("must be in the future")
    return format_instant(instant)


FutureInstant = Annotated[
    str, Field(max_length=64, json_schema_extra={"format": "date-time"}), AfterValidator(_future_instant)
]


def _until_may_be_null(schema: dict[str, Any]) -> None:
    _omitted_not_null(schema)
    until = schema["properties"]["until"]
    schema["properties"]["until"] = {"anyOf": [until, {"type": "null"}]}


class PresenceSet(StrictModel):
    """`presence.set` and the body of PUT /v1/users/<id>/status: at least one field; `until` may be null."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, json_schema_extra=_until_may_be_null)

    status: StatusName | None = None
    text: _printable(MAX_STATUS_TEXT) | None = None
    emoji: _printable(MAX_STATUS_EMOJI) | None = None
    # null clears the expiry; omitted leaves it as it is (`model_fields_set` tells them apart).
    until: FutureInstant | None = None
    invisible: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None and key != "until":
                    raise ValueError(f"{key} must not be null")
        return data

    @model_validator(mode="after")
    def _something(self) -> "PresenceSet":
        if not self.model_fields_set:
            raise ValueError("give at least one of status, text, emoji, until, invisible")
        return self


class PresenceActivity(StrictModel):
    idle: bool


class PresenceQuery(StrictModel):
    users: Annotated[list[Identifier], Field(min_length=1, max_length=MAX_QUERY_USERS)]


# ── server → client ──────────────────────────────────────────────────────────
# Exactly the fields the server sends (a frame with another field is a bug the frame tests catch).
@with_config(ConfigDict(extra="forbid"))
class ConnectionAck(TypedDict):
    connection_id: str
    user: str
    channels: list[str]


@with_config(ConfigDict(extra="forbid"))
class StatusOut(TypedDict):
    """A user's status as watchers see it."""

    status: StatusName
    text: str
    emoji: str
    until: str | None
    idle: bool


@with_config(ConfigDict(extra="forbid"))
class PresenceSnapshot(TypedDict):
    online: list[str]
    # The status of every user in `online`.
    status: dict[str, StatusOut]
    # The user's large channels and how many of their members are online (only when there are).
    occupancy: NotRequired[dict[str, int]]


@with_config(ConfigDict(extra="forbid"))
class PresenceStatus(TypedDict):
    user: str
    status: StatusName
    text: str
    emoji: str
    until: str | None
    idle: bool
    # Only on the user's own connections.
    invisible: NotRequired[bool]


@with_config(ConfigDict(extra="forbid"))
class QueriedUser(TypedDict):
    state: Literal["online", "offline"]
    last_seen_at: str | None
    status: StatusName
    text: str
    emoji: str
    until: str | None
    idle: bool


@with_config(ConfigDict(extra="forbid"))
class PresenceResult(TypedDict):
    users: dict[str, QueriedUser]


@with_config(ConfigDict(extra="forbid"))
class PresenceOccupancy(TypedDict):
    channel: str
    online: int
    # False once, when the channel stopped being large: its people are announced from here on.
    large: NotRequired[bool]


@with_config(ConfigDict(extra="forbid"))
class PresenceChanged(TypedDict):
    user: str
    state: Literal["online", "offline"]


@with_config(ConfigDict(extra="forbid"))
class MessageAck(TypedDict):
    idem_key: str
    id: str
    channel: str
    seq: int


@with_config(ConfigDict(extra="forbid"))
class MessageCreated(TypedDict):
    """A stored message: the `message.created` payload and an item of the history API."""

    id: str
    channel: str
    seq: int
    user: str
    text: str
    created_at: str


@with_config(ConfigDict(extra="forbid"))
class Signal(TypedDict):
    """`signal` to the other members: who sent it where; `data` is `{}` when the sender gave none."""

    channel: str
    user: str
    name: str
    data: dict[str, Any]


@with_config(ConfigDict(extra="forbid"))
class RegisterAck(TypedDict):
    instance: str
    registered_at: str


@with_config(ConfigDict(extra="forbid"))
class DeregisterAck(TypedDict):
    instance: str


@with_config(ConfigDict(extra="forbid"))
class ErrorPayload(TypedDict):
    code: str
    message: str
    # The offending frame's type, when it is known.
    type: NotRequired[str]
    # `rate_limited`: how long to wait before the connection's next frame is accepted.
    retry_after_ms: NotRequired[int]


# ── query-string parameters ──────────────────────────────────────────────────
class Cursor(BaseModel):
    """`cursor`: `{"<channel uuid>": <last seq seen>}`; `{}` is allowed."""

    positions: dict[ChannelId, Annotated[int, Field(ge=0, strict=True)]]


def parse_cursor(raw: str) -> dict[str, int]:
    """Return the cursor's positions, or raise ValueError with a readable reason."""
    try:
        # orjson: nesting past 1,024 levels is a decode error, where json.loads raised
        # RecursionError (not a ValueError) from about 1,000.
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ValueError("cursor is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("cursor must be a JSON object of channel id to seq")
    try:
        return Cursor(positions=data).positions
    except ValidationError as error:
        raise ValueError(describe_validation_error(error)) from None


def describe_validation_error(error: ValidationError) -> str:
    """Return one readable sentence for the first problem pydantic found."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    message = first["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return f"{where}: {message}" if where else message
