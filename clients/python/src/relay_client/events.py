"""The frames of the wire protocol, both ways, and the client's own events, as plain dataclasses.

A frame class's fields are exactly its payload's fields in the contract (docs/contract.md,
section 3), with the JSON types they carry, so each class can be checked against a JSON Schema of
the frames. A frame from the server is parsed into its class or refused whole: a client never acts
on half a frame. Fields the contract does not name are ignored, so the server may add some.
"""

import dataclasses
import json
import types
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from relay_client.exceptions import ProtocolError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


# ── server → client ──────────────────────────────────────────────────────────
@dataclass(frozen=True, slots=True)
class ConnectionAck:
    connection_id: str
    user: str
    channels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PresenceSnapshot:
    online: tuple[str, ...]
    # user -> {"status", "text", "emoji", "until", "idle"} for every user in `online`.
    status: dict[str, dict] = dataclasses.field(default_factory=dict)
    # The user's large channels and how many of their members are online: in those, people are
    # counted instead of named (docs/contract.md, Large rooms).
    occupancy: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class PresenceStatus:
    """`user`'s status changed (docs/contract.md, Rich presence). `invisible` only about oneself."""

    user: str
    status: Literal["available", "away", "busy", "dnd"]
    text: str
    emoji: str
    until: str | None
    idle: bool
    invisible: bool | None = None


@dataclass(frozen=True, slots=True)
class PresenceResult:
    """The answer to `query()`: user -> {"state", "last_seen_at", "status", ...}, co-members only."""

    users: dict[str, dict]


@dataclass(frozen=True, slots=True)
class PresenceOccupancy:
    """How many members of a large channel are online now (at most once a second, the last always)."""

    channel: str
    online: int
    # False once, when the channel stopped being large: its people come as PresenceChanged from here on.
    large: bool | None = None


@dataclass(frozen=True, slots=True)
class PresenceChanged:
    """`user` came online or went offline (after the grace period)."""

    user: str
    state: Literal["online", "offline"]


@dataclass(frozen=True, slots=True)
class MessageAck:
    """The answer to `send()`: the message is stored as `seq` of `channel`."""

    idem_key: str
    id: str
    channel: str
    seq: int


@dataclass(frozen=True, slots=True)
class MessageCreated:
    """A message of one of the user's channels (the user's own included)."""

    id: str
    channel: str
    seq: int
    user: str
    text: str
    created_at: str


@dataclass(frozen=True, slots=True)
class RegisterAck:
    instance: str
    registered_at: str


@dataclass(frozen=True, slots=True)
class DeregisterAck:
    instance: str


@dataclass(frozen=True, slots=True)
class Error:
    """An `error` frame that answered none of this client's requests; `type` is the offending frame's."""

    code: str
    message: str
    type: str | None = None
    # `rate_limited`: how long to wait before the connection's next frame is accepted.
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Signal:
    """Another member's signal in one of the user's channels (`name`, e.g. "typing", and its `data`).

    Ephemeral: never stored and never resumed; one missed while disconnected is gone.
    """

    channel: str
    user: str
    name: str
    data: dict[str, Any]


# ── client → server ──────────────────────────────────────────────────────────
@dataclass(frozen=True, slots=True)
class MessageSend:
    idem_key: str
    channel: str
    text: str


@dataclass(frozen=True, slots=True)
class Resume:
    """The cursor, sent first on a connection opened with `resume=frame` (a cursor too long for a URL)."""

    cursor: dict[str, int]


@dataclass(frozen=True, slots=True)
class Register:
    instance: str
    # Only the fields given: `cognition`, `family`, `host` (strings) and `weight` (a number).
    capability: dict[str, str | float]


@dataclass(frozen=True, slots=True)
class SignalSend:
    channel: str
    name: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    instance: str


@dataclass(frozen=True, slots=True)
class Deregister:
    instance: str


@dataclass(frozen=True, slots=True)
class PresenceSet:
    """Only the fields given travel: a field left at its default is not sent. `until=None` is sent
    (it clears the expiry), so `until`'s "not given" is "" (which is never a valid time)."""

    status: Literal["available", "away", "busy", "dnd"] | None = None
    text: str | None = None
    emoji: str | None = None
    until: str | None = ""
    invisible: bool | None = None


@dataclass(frozen=True, slots=True)
class PresenceActivity:
    idle: bool


@dataclass(frozen=True, slots=True)
class PresenceQuery:
    users: tuple[str, ...]


SERVER_FRAMES: dict[str, type] = {
    "connection.ack": ConnectionAck,
    "presence.snapshot": PresenceSnapshot,
    "presence.changed": PresenceChanged,
    "presence.status": PresenceStatus,
    "presence.result": PresenceResult,
    "presence.occupancy": PresenceOccupancy,
    "message.ack": MessageAck,
    "message.created": MessageCreated,
    "register.ack": RegisterAck,
    "deregister.ack": DeregisterAck,
    "signal": Signal,
    "error": Error,
}
CLIENT_FRAMES: dict[str, type] = {
    "message.send": MessageSend,
    "resume": Resume,
    "register": Register,
    "heartbeat": Heartbeat,
    "deregister": Deregister,
    "presence.set": PresenceSet,
    "presence.activity": PresenceActivity,
    "presence.query": PresenceQuery,
    "signal": SignalSend,
}
_CLIENT_TYPES = {cls: frame_type for frame_type, cls in CLIENT_FRAMES.items()}

ServerFrame = (
    ConnectionAck
    | PresenceSnapshot
    | PresenceChanged
    | PresenceStatus
    | PresenceResult
    | PresenceOccupancy
    | MessageAck
    | MessageCreated
    | RegisterAck
    | DeregisterAck
    | Signal
    | Error
)
ClientFrame = (
    MessageSend
    | Resume
    | Register
    | Heartbeat
    | Deregister
    | SignalSend
    | PresenceSet
    | PresenceActivity
    | PresenceQuery
)


# ── the client's own events ──────────────────────────────────────────────────
@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection closed with `code` (1006: it dropped); the client is reconnecting.

    Until `Reconnected`, `Client.online` is the last view the client had.
    """

    code: int


@dataclass(frozen=True, slots=True)
class Reconnected:
    """A new connection is up: presence changes missed meanwhile follow, then missed messages, then live ones."""

    connection_id: str


Event = (
    PresenceChanged | PresenceStatus | PresenceOccupancy | MessageCreated | Signal | Error | Disconnected | Reconnected
)

F = TypeVar("F", bound="DataclassInstance")


def parse_frame(raw: str | bytes) -> ServerFrame | None:
    """The server frame `raw` holds; None for a type this client does not know (the server may add some).

    Raises ProtocolError for anything that is not a well-formed frame.
    """
    if not isinstance(raw, str):
        raise ProtocolError("a binary frame (Relay sends JSON text)")
    try:
        data = json.loads(raw)
    except ValueError:
        raise ProtocolError("a frame that is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError("a frame that is not a {type, payload} object")
    cls = SERVER_FRAMES.get(data["type"])
    if cls is None:
        return None
    return from_payload(cls, data.get("payload"), data["type"])


def from_payload(cls: type[F], payload: Any, frame_type: str) -> F:
    """Build `cls` from a payload, checking every field's JSON type; raise ProtocolError if it does not fit."""
    if not isinstance(payload, dict):
        raise ProtocolError(f"{frame_type}: the payload is not an object")
    hints = _hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        if field.name not in payload:
            # A field with a default (or a default factory) may be absent: an older server's frame.
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{frame_type}: {field.name} is missing")
            continue
        value = payload[field.name]
        if not _fits(value, hints[field.name]):
            raise ProtocolError(f"{frame_type}: {field.name} is not a {hints[field.name]}")
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def frame_text(frame: ClientFrame) -> str:
    """The JSON text of a client frame."""
    payload = dataclasses.asdict(frame)
    if isinstance(frame, PresenceSet):
        payload = {
            field.name: payload[field.name]
            for field in dataclasses.fields(frame)
            if payload[field.name] != field.default
        }
    return json.dumps({"type": _CLIENT_TYPES[type(frame)], "payload": payload})


@cache
def _hints(cls: "type[DataclassInstance]") -> dict[str, Any]:
    return get_type_hints(cls)


def _fits(value: Any, hint: Any) -> bool:
    """Whether a decoded JSON value has the type `hint` names (bool is not a number here, as in JSON)."""
    origin = get_origin(hint)
    if hint is Any:
        return True
    if hint is str:
        return isinstance(value, str)
    if hint is bool:
        return isinstance(value, bool)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    if origin is Literal:
        return isinstance(value, str) and value in get_args(hint)
    if origin is tuple:
        return isinstance(value, list) and all(_fits(item, get_args(hint)[0]) for item in value)
    if origin is dict:
        key, item = get_args(hint)
        return isinstance(value, dict) and all(_fits(k, key) and _fits(v, item) for k, v in value.items())
    if origin in (Union, types.UnionType):
        return any(_fits(value, option) for option in get_args(hint))
    raise TypeError(f"no JSON check for {hint}")
