"""Property-based fuzzing of the client frames against a real instance (hypothesis).

Each example is one connection of linh's that sends a random sequence of frames: valid ones drawn
from the contract's grammar (every client frame type, with payloads the schemas accept) mixed with
mutated ones (wrong types, missing and extra fields, oversize strings, control characters, lone
surrogates, NaN and Infinity, huge numbers, deep nesting, truncated JSON, binary frames, server
frame types), and at times one frame over 1 MiB at the end. What must hold, whatever was sent:

- the socket stays open, unless a frame was over 1 MiB (then it is closed 1009);
- every valid frame is answered (its ack), and no answer is `internal`;
- the instance logs no traceback and no `frame.failed`;
- after the client closes, tuan (a co-member) hears linh go offline after the grace, and linh's
  one slot (RELAY_MAX_CONNECTIONS_PER_USER=1) is free: the next example's connect is admitted.

`make test` runs a fixed, derandomized set of examples. RELAY_FUZZ_EXAMPLES=500 runs that many
random ones instead. Hypothesis keeps no example database (`database=None`).
"""

import asyncio
import json
import os
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import WAIT, Instance, WsClient, connect, heard, states, timings

pytestmark = [pytest.mark.live, pytest.mark.heavy]

EXAMPLES = int(os.environ.get("RELAY_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=EXAMPLES or 60,
    derandomize=not EXAMPLES,
    database=None,
    deadline=None,
    # One instance serves every example: the fixture is meant to outlive them.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
GRACE, MARGIN = 150, 50
MIB = 1024 * 1024
SERVER_TYPES = (
    "connection.ack",
    "presence.snapshot",
    "presence.changed",
    "message.ack",
    "message.created",
    "register.ack",
    "deregister.ack",
    "error",
)
# The codes a bad frame may earn; `internal` is never one of them.
REFUSALS = {"invalid_frame", "invalid_payload", "not_a_member", "instance_owned"}


@dataclass
class Frame:
    """One thing to send: a text frame or a binary one, and the answer it must get, if any."""

    data: str | bytes
    # (frame type, payload field, value) of the answer a valid frame must get.
    answer: tuple[str, str, str] | None = None

    def __repr__(self) -> str:
        # A failing example is printed: not all of a 1 MiB frame.
        cut = "..." if len(self.data) > 200 else ""
        return f"Frame({self.data[:200]!r}{cut}, answer={self.answer!r})"


@dataclass
class Sequence:
    frames: list[Frame] = field(default_factory=list)
    oversize: bool = False


# ── the grammar ───────────────────────────────────────────────────────────────
# Identifiers: 1-128 characters, no control characters (Cc) and no lone surrogates (Cs).
identifier = st.text(st.characters(exclude_categories=("Cc", "Cs")), min_size=1, max_size=40)
long_identifier = st.text(st.characters(exclude_categories=("Cc", "Cs")), min_size=128, max_size=128)
texts = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=200),
    # The longest text allowed, in one-, two- and four-byte characters.
    st.sampled_from(["x" * 16_384, "é" * 16_384, "\U0001f600" * 16_384]),
)
finite = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and ±Infinity included: JSON has neither
    st.text(),  # lone surrogates included
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def encode(value: object, ascii_only: bool) -> str:
    """JSON text as a client might write it; lone surrogates and NaN only survive as ASCII escapes/literals."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True)
    return text


def client_frames(channels: list[str], prefix: str) -> st.SearchStrategy:
    """Valid (type, payload, answer) triples of every client frame type."""
    channel = st.sampled_from(channels).flatmap(
        lambda c: st.sampled_from([c, c.upper(), c.replace("-", "")])  # canonicalized by the schema
    )
    instance = identifier.map(lambda name: f"{prefix}-{name}"[:128])
    capability = st.fixed_dictionaries(
        {}, optional={"cognition": identifier, "weight": finite, "family": identifier, "host": long_identifier}
    )

    def send(payload: dict) -> tuple:
        return "message.send", payload, ("message.ack", "idem_key", payload["idem_key"])

    def register(payload: dict) -> tuple:
        return "register", payload, ("register.ack", "instance", payload["instance"])

    return st.one_of(
        st.fixed_dictionaries({"idem_key": identifier, "channel": channel, "text": texts}).map(send),
        st.fixed_dictionaries({"instance": instance}, optional={"capability": capability}).map(register),
        # No answer either way: a heartbeat is silent, and a deregister answers only a registered instance.
        st.fixed_dictionaries({"instance": instance}).map(lambda p: ("heartbeat", p, None)),
        st.fixed_dictionaries({"instance": instance}).map(lambda p: ("deregister", p, None)),
    )


@st.composite
def mutated(draw: st.DrawFn, channels: list[str]) -> Frame:
    """A frame of the grammar with one thing wrong with it (or, by chance, nothing wrong)."""
    # A prefix of its own: a mutation that happens to be valid never touches the valid frames' instances.
    frame_type, payload, _ = draw(client_frames(channels, "mutant"))
    payload = dict(payload)
    how = draw(
        st.sampled_from(
            ["drop", "extra", "retype", "oversize", "control", "surrogate", "not an object", "type", "envelope"]
        )
    )
    key = draw(st.sampled_from(sorted(payload)))
    if how == "drop":
        del payload[key]
    elif how == "extra":
        payload[draw(st.text(max_size=12))] = draw(json_values)
    elif how == "retype":
        payload[key] = draw(json_values)
    elif how == "oversize":
        payload[key] = "x" * (16_385 if key == "text" else 129)
    elif how == "control":
        payload[key] = f"a{chr(draw(st.sampled_from([0, 9, 10, 27, 127, 133, 159])))}b"
    elif how == "surrogate":
        payload[draw(st.sampled_from([key, "\ud800"]))] = draw(st.sampled_from(["\ud800", "a\udfffb"]))
    elif how == "not an object":
        payload = draw(json_values.filter(lambda v: not isinstance(v, dict)))
    envelope: dict = {"type": frame_type, "payload": payload}
    if how == "type":
        envelope["type"] = draw(st.one_of(st.sampled_from(SERVER_TYPES), st.text(max_size=70), json_values))
    elif how == "envelope":
        envelope = draw(
            st.sampled_from(
                [{"type": frame_type}, {"payload": payload}, {**envelope, "extra": 1}, [frame_type, payload]]
            )
        )
    return Frame(encode(envelope, draw(st.booleans())))


@st.composite
def raw(draw: st.DrawFn) -> Frame:
    """Frames that are wrong below the JSON value: nesting, numbers, literals, truncation, bytes."""
    kind = draw(st.sampled_from(["deep", "deep payload", "huge integer", "literal", "truncated", "text", "binary"]))
    if kind == "deep":
        depth = draw(st.integers(900, 3_000))
        return Frame("[" * depth + "]" * depth)
    if kind == "deep payload":
        depth = draw(st.integers(900, 3_000))
        return Frame('{"type": "message.send", "payload": ' + '{"a": ' * depth + "1" + "}" * depth + "}")
    if kind == "huge integer":
        digits = draw(st.integers(4_301, 20_000))
        return Frame(
            '{"type": "register", "payload": {"instance": "w", "capability": {"weight": ' + "9" * digits + "}}}"
        )
    if kind == "literal":
        literal = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]))
        return Frame('{"type": "register", "payload": {"instance": "w", "capability": {"weight": ' + literal + "}}}")
    if kind == "truncated":
        whole = '{"type": "message.send", "payload": {"idem_key": "k", "channel": "c", "text": "hi"}}'
        return Frame(whole[: draw(st.integers(0, len(whole) - 1))])
    if kind == "text":
        return Frame(draw(st.text(st.characters(exclude_categories=("Cs",)), max_size=50)))
    return Frame(draw(st.binary(max_size=64)))


@st.composite
def sequences(draw: st.DrawFn, channels: list[str]) -> Sequence:
    prefix = uuid.uuid4().hex[:8]  # this example's agent instances, so no two examples share one
    registered: set[str] = set()
    sequence = Sequence()
    for _ in range(draw(st.integers(1, 10))):
        choice = draw(st.sampled_from(["valid", "mutated", "raw"]))
        if choice == "valid":
            frame_type, payload, answer = draw(client_frames(channels, prefix))
            if frame_type == "register":
                registered.add(payload["instance"])
            elif frame_type == "deregister" and payload["instance"] in registered:
                registered.discard(payload["instance"])
                answer = ("deregister.ack", "instance", payload["instance"])
            envelope = {"type": frame_type, "payload": payload}
            sequence.frames.append(Frame(encode(envelope, draw(st.booleans())), answer))
        elif choice == "mutated":
            sequence.frames.append(draw(mutated(channels)))
        else:
            sequence.frames.append(draw(raw()))
    if draw(st.integers(0, 9)) == 0:
        sequence.oversize = True
        sequence.frames.append(Frame('{"type": "message.send", "payload": "' + "x" * MIB + '"}'))
    return sequence


# ── the property ──────────────────────────────────────────────────────────────
def answered(client: WsClient, after: int, answer: tuple[str, str, str]) -> bool:
    frame_type, key, value = answer
    return any(f["type"] == frame_type and f["payload"].get(key) == value for f in client.frames[after:])


async def exchange(instance: Instance, token: str, tuan: WsClient, fleet: str, sequence: Sequence) -> None:
    heard_before = len(states(tuan, "linh"))
    # Admitted (its one slot is free) and announced: the previous example's offline came first.
    linh = await WsClient.open(instance.ws_url(token))
    await linh.next_of("presence.snapshot", timeout=WAIT)
    assert await heard(tuan, "linh", heard_before + 1) == [*states(tuan, "linh")[:heard_before], "online"]
    try:
        after = len(linh.frames)
        for frame in sequence.frames:
            await linh.connection.send(frame.data)
        if sequence.oversize:
            # Closed on the oversize frame's header: answers to the frames before it may be cut off.
            assert await linh.closed(timeout=WAIT) == 1009
        else:
            # Frames are handled in order: once this is answered, every frame before it was.
            sentinel = uuid.uuid4().hex
            await linh.send("message.send", {"idem_key": sentinel, "channel": fleet, "text": "sentinel"})
            await linh.wait_for(lambda c: answered(c, after, ("message.ack", "idem_key", sentinel)), WAIT)
            assert linh.close_code is None
            missing = [f for f in sequence.frames if f.answer and not answered(linh, after, f.answer)]
            assert missing == [], [f["type"] for f in linh.frames[after:]]
        codes = {payload["code"] for payload in linh.of_type("error")}
        assert codes <= REFUSALS
    finally:
        await linh.close()
    assert await heard(tuan, "linh", heard_before + 2) == [*states(tuan, "linh")[:heard_before], "online", "offline"]
    log = instance.log_path.read_text()
    assert "Traceback" not in log
    assert instance.events("frame.failed") == []


def test_fuzzed_frame_sequences_never_break_a_connection_or_its_release(live_instances, acme):
    (instance,) = live_instances(1, **timings(grace=GRACE, margin=MARGIN, RELAY_MAX_CONNECTIONS_PER_USER=1))
    channels = [str(acme.channels["fleet"].id), str(acme.channels["general"].id)]
    token = acme.token("linh")
    loop = asyncio.new_event_loop()
    tuan = loop.run_until_complete(connect(instance, acme, "tuan"))

    @FUZZ
    @given(sequence=sequences(channels))
    def holds(sequence: Sequence) -> None:
        loop.run_until_complete(exchange(instance, token, tuan, channels[0], sequence))

    try:
        holds()
        # The last example's slot is free too.
        last = loop.run_until_complete(connect(instance, acme, "linh"))
        loop.run_until_complete(last.close())
    finally:
        loop.run_until_complete(tuan.close())
        loop.close()
