"""The wire schema (CONTRACT.md section 3): every client frame's payload, strict, in one place.

Strict means: unknown fields, missing fields, wrong JSON types (no coercion of "1"
to 1), `null` where a value is expected, empty or over-long strings and control
characters are all refused. The owning app binds each type to its handler through
`relay.registry`; this module only says what a well-formed payload is.
"""

import json
import uuid
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

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


Identifier = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_no_control_characters)]
ChannelId = Annotated[str, Field(min_length=32, max_length=36), AfterValidator(_canonical_uuid)]
MessageText = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_LENGTH), AfterValidator(_no_nul)]


class StrictModel(BaseModel):
    """Refuses unknown fields, coercion and explicit nulls; an optional field is one that may be omitted."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

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


# ── query-string parameters ──────────────────────────────────────────────────
class Cursor(BaseModel):
    """`cursor`: `{"<channel uuid>": <last seq seen>}`; `{}` is allowed."""

    positions: dict[ChannelId, Annotated[int, Field(ge=0, strict=True)]]


def parse_cursor(raw: str) -> dict[str, int]:
    """Return the cursor's positions, or raise ValueError with a readable reason."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
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
