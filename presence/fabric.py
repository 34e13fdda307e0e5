"""Presence's fabric: one channel-layer group per channel, the transition message, per-connection dedup.

A transition is sent to the group of every channel of its subject, so a watcher sharing three
channels with the subject receives three copies of one transition; the transition id, minted
once, is what lets each connection deliver exactly one frame (docs/contract.md, 4. Presence semantics). Each copy says
how many there are, so the common single copy is delivered without remembering its id.
"""

import sys
import uuid
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationError

from relay.frames import MAX_STATUS_EMOJI, MAX_STATUS_TEXT, ChannelId, Identifier, StatusName, StrictModel

TRANSITION = "presence.transition"
STATUS_CHANGE = "presence.status_change"
UNKNOWN_GROUP = "presence.unknown"
# Every copy of one transition arrives within milliseconds of the others, so a connection only
# needs the ids of its most recent transitions; 256 bounds the memory of a busy watcher.
DEDUP_WINDOW = 256

State = Literal["online", "offline"]


# Every presence group's name starts with this, and no other group's does.
GROUP_PREFIX = "presence."


def group_name(channel_id: str) -> str:
    """The channel-layer group presence transitions of one channel are sent to."""
    return f"{GROUP_PREFIX}{channel_id}"


def _uuid(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValueError("must be a UUID") from None


class Transition(StrictModel):
    """A presence transition as it crosses the channel layer; strict, so a stray field is refused."""

    type: Literal["presence.transition"]
    user: Identifier
    state: State
    transition: Annotated[str, AfterValidator(_uuid)]
    channel: ChannelId
    # How many channels the transition was published to. With one there is no other copy to
    # deduplicate, so a connection does not remember its id (each remembered id costs memory
    # on every idle watcher). Absent: unknown, deduplicated as always.
    copies: Annotated[int, Field(ge=1)] | None = None
    # Whom it is for, when not every watcher of the channel: the announcement of a member just
    # added goes only to those who could not see them before (`presence.announce`).
    audience: list[Identifier] | None = None
    # Whom it is not for: an invisible user's own connections are not told they went offline
    # (presence/status.py), while everyone else is.
    skip: Identifier | None = None
    # Sent once more by its publisher, whose layer was unsteady (`PresenceService._send`): a process
    # drops the copy of a single one it heard the first time (`Fanout.deliver`).
    again: bool = False

    @property
    def single(self) -> bool:
        """True when this is the only copy of the transition anywhere."""
        return self.copies == 1


def transition_message(
    user_id: str,
    state: State,
    transition_id: str,
    channel_id: str,
    copies: int | None = None,
    audience: list[str] | None = None,
    skip: str | None = None,
    again: bool = False,
) -> dict:
    """The group message for one channel's copy of a transition (`copies`: of how many; `again`: sent once more)."""
    message = {"type": TRANSITION, "user": user_id, "state": state, "transition": transition_id, "channel": channel_id}
    if copies is not None:
        message["copies"] = copies
    if again:
        message["again"] = True
    if audience is not None:
        message["audience"] = audience
    if skip is not None:
        message["skip"] = skip
    return message


class StatusChange(StrictModel):
    """A user's status as it crosses the channel layer (presence/status.py).

    The copies with a `channel` are for the watchers of that channel and are deduplicated by
    `change` like a transition; the copy without one, for the user's own connections, names the
    user's `environment` (its group is every user's) and carries `invisible`.
    """

    type: Literal["presence.status_change"]
    user: Identifier
    status: StatusName
    text: Annotated[str, Field(max_length=MAX_STATUS_TEXT)]
    emoji: Annotated[str, Field(max_length=MAX_STATUS_EMOJI)]
    # "" for none: the fabric's models refuse nulls.
    until: Annotated[str, Field(max_length=64)]
    idle: bool
    invisible: bool
    change: Annotated[str, AfterValidator(_uuid)]
    channel: ChannelId | None = None
    copies: Annotated[int, Field(ge=1)] | None = None
    environment: Annotated[str, AfterValidator(_uuid)] | None = None

    @property
    def single(self) -> bool:
        """True when this is the only copy for watchers anywhere."""
        return self.copies == 1


def parse_fabric(message: dict) -> Transition | StatusChange | None:
    """A presence group message of either kind, validated (None when it is neither)."""
    if message.get("type") == STATUS_CHANGE:
        try:
            return StatusChange.model_validate(message)
        except ValidationError:
            return None
    return parse_transition(message)


def parse_transition(message: dict) -> Transition | None:
    """Return the message as a Transition, or None when it is not a well-formed one.

    Every local watcher of a channel receives its own copy of each transition, within
    milliseconds of the others: the first copy is validated and the outcome (a frozen model, or
    None) is reused for the identical copies that follow, so a transition costs one validation
    per process rather than one per watcher.
    """
    try:
        # Each value's type is part of the key: 1 and True are equal, and only one is valid.
        key = tuple((name, type(value), value) for name, value in sorted(message.items()))
        parsed = _parsed.get(key, _UNSEEN)
    except TypeError:
        # Unhashable values or unsortable keys: not a transition's shape, validate it as it is.
        return _validate(message)
    if parsed is _UNSEEN:
        parsed = _validate(message)
        if len(_parsed) >= PARSED_MEMORY:
            _parsed.clear()
        _parsed[key] = parsed
    return parsed


# How many recent copies' outcomes a process remembers; copies of one transition arrive together.
PARSED_MEMORY = 1024
_UNSEEN = object()
_parsed: dict[tuple, Transition | None] = {}


def _validate(message: dict) -> Transition | None:
    try:
        return Transition.model_validate(message)
    except ValidationError:
        return None


def subject_of(message: dict) -> str:
    """The group a (possibly malformed) message names, for the log: `presence.<channel>`."""
    channel = message.get("channel")
    if isinstance(channel, str):
        try:
            return group_name(str(uuid.UUID(channel)))
        except ValueError:
            pass
    return UNKNOWN_GROUP


class Dedup:
    """The ids of the last `size` transitions one connection delivered."""

    # Slots: one of these lives on every idle connection.
    __slots__ = ("_seen", "size")

    def __init__(self, size: int = DEDUP_WINDOW) -> None:
        self.size = size
        # A plain dict keeps insertion order too, without OrderedDict's linked list per entry.
        self._seen: dict[str, None] = {}

    def claim(self, transition_id: str) -> bool:
        """True the first time an id is seen, False for every later copy."""
        if transition_id in self._seen:
            return False
        # Interned: every local watcher of a transition parsed its own copy of the id, and a full
        # window would keep 256 of them per connection; interned, they share one string.
        self._seen[sys.intern(transition_id)] = None
        if len(self._seen) > self.size:
            del self._seen[next(iter(self._seen))]
        return True

    def __len__(self) -> int:
        return len(self._seen)
