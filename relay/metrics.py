"""Prometheus metric families, defined in one place so every app records into the same names.

Each Daphne instance is one process and exposes its own registry at /metrics;
Prometheus scrapes every instance and sums across them.
"""

import functools

from prometheus_client import Counter, Gauge, Histogram

CONNECTIONS_OPEN = Gauge("relay_connections_open", "WebSocket connections open on this instance")
CONNECTS = Counter("relay_connects_total", "WebSocket connections accepted")
CLOSES = Counter("relay_closes_total", "WebSocket connections closed after being accepted")
REFUSED = Counter("relay_connections_refused_total", "WebSocket connections refused", ["code"])
FRAMES_IN = Counter("relay_frames_in_total", "Frames received from clients, by type", ["type"])
FRAMES_OUT = Counter("relay_frames_out_total", "Frames sent to clients, by type", ["type"])

PRESENCE_PUBLISHED = Counter("relay_presence_published_total", "Presence transitions published", ["state"])
PRESENCE_SUPPRESSED = Counter(
    "relay_presence_suppressed_total", "Presence transitions suppressed, by reason", ["state", "reason"]
)
PRESENCE_FAILURES = Counter("relay_presence_failures_total", "Failed presence operations, by op", ["op"])
PRESENCE_INVALID_PAYLOADS = Counter(
    "relay_presence_invalid_payloads_total", "Fabric messages dropped as malformed transitions"
)
PRESENCE_DEDUP_DROPS = Counter(
    "relay_presence_dedup_drops_total", "Copies of a transition a connection had already delivered"
)

AGENT_REGISTRATIONS = Counter("relay_agent_registrations_total", "Agent register frames, by outcome", ["outcome"])
AGENT_SWEPT = Counter("relay_agent_swept_total", "Agent registrations removed by the sweep")

MESSAGE_SEND_SECONDS = Histogram(
    "relay_message_send_seconds",
    "message.send handling time, from frame to ack",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
REDIS_OP_SECONDS = Histogram(
    "relay_redis_op_seconds",
    "Presence Redis round trips, by op",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)


# Bound children for the label values the hot paths use (a fixed set each): `labels()` checks
# and looks up its arguments under a lock on every call, a few µs per frame sent.
@functools.cache
def frames_out(frame_type: str) -> Counter:
    """The `relay_frames_out_total` child of one server frame type."""
    return FRAMES_OUT.labels(type=frame_type)


@functools.cache
def presence_published(state: str) -> Counter:
    """The `relay_presence_published_total` child of one state: one per first connect."""
    return PRESENCE_PUBLISHED.labels(state=state)


@functools.cache
def redis_op_seconds(op: str) -> Histogram:
    """The `relay_redis_op_seconds` child of one presence operation."""
    return REDIS_OP_SECONDS.labels(op=op)
