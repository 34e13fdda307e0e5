"""The contract's promises held against a recorded history (docs/reliability.md, "What is checked").

Pure functions over the records of chaos/history.py: no I/O and no clock, so a history is
re-checked offline exactly as it was checked at the end of its run. Every promise allows for the
faults the nemesis injected: what a fault may excuse, and for how long after it healed, is said
where each invariant is checked.

Times are the history's: seconds since the run began, as the clients observed them. A client's
"connected" is the span from its `connection.ack` to the moment it closed or saw the close; the
server's own span contains it, so a promise checked on the client's span is never stricter than
the server's.
"""

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

INVARIANTS = (
    "convergence",
    "no_false_offline",
    "one_frame_per_transition",
    "messages",
    "tenant_walls",
    "reach",
    "no_traceback",
)
# The faults that touch one client only (its user and its socket), not the deployment.
LOCAL_FAULTS = {"stall"}
# A membership change answered with one of these took effect; any other answer leaves it unknown.
APPLIED = {"add": {200, 201}, "remove": {204}}
# Convergence is sampled this often (seconds), besides every checkpoint.
SAMPLE_EVERY = 2.0
# Violations kept per invariant: the first ones show a bug, the rest repeat it.
KEEP_PER_INVARIANT = 10
EXCERPT_RECORDS = 40
NEVER = math.inf


@dataclass(frozen=True)
class Timings:
    """Presence's timings of the run (seconds) and the checker's allowance for a loaded machine."""

    grace: float
    ttl: float
    refresh: float
    margin: float
    slack: float

    @property
    def settle(self) -> float:
        """How long a user's connections must be unchanged before every watcher must know it."""
        return self.grace + self.margin + self.refresh + self.slack

    @property
    def converge(self) -> float:
        """How long after a fault healed presence must equal the truth again."""
        return self.ttl + self.grace + 2 * self.refresh + self.slack


@dataclass
class Violation:
    invariant: str
    summary: str
    excerpt: list[dict] = field(default_factory=list)
    # (which records, from, to): the excerpt, read from the history only for the violations kept.
    scope: tuple[Callable[[dict], bool], float, float] | None = field(default=None, repr=False)


@dataclass
class Report:
    seed: int | None
    replay: str
    violations: list[Violation]
    checks: dict[str, int]
    operations: dict[str, int]
    faults: dict[str, int]
    # Violations found per invariant, before keeping only the first few of each.
    found: dict[str, int] = field(default_factory=dict)


@dataclass
class Conn:
    """One client connection as its client saw it."""

    id: str
    tenant: str
    user: str
    cursor: dict | None
    t_open: float
    t_ack: float | None = None
    t_close: float = NEVER
    snapshot_t: float | None = None
    snapshot: frozenset = frozenset()
    # user -> [(t, "online"|"offline")] in arrival order
    changes: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    # channel -> [(t, seq)] in arrival order
    messages: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: defaultdict(list))


@dataclass
class Fault:
    kind: str
    t: float
    t_end: float
    target: str | None

    @property
    def local(self) -> bool:
        return self.kind in LOCAL_FAULTS

    def overlaps(self, start: float, end: float) -> bool:
        return self.t <= end and self.t_end >= start


class Memberships:
    """Who was a member of which channel when, from the start and every change through the API.

    A change in flight, or one whose answer did not say it took effect, leaves that membership
    unknown until a later change settles it.
    """

    def __init__(self, initial: Iterable[tuple[str, str, str]], ops: list[dict], slack: float) -> None:
        self.slack = slack
        self.ops_of_user: dict[tuple[str, str], list[dict]] = defaultdict(list)
        self.ops_of_pair: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
        for op in sorted(ops, key=lambda op: op["t"]):
            self.ops_of_user[(op["tenant"], op["user"])].append(op)
            self.ops_of_pair[(op["tenant"], op["channel"], op["user"])].append(op)
        self.initial: dict[tuple[str, str], set[str]] = defaultdict(set)
        for tenant, channel, user in initial:
            self.initial[(tenant, user)].add(channel)
        # Per user: [(t, true channels, unknown channels)], each state from t on.
        self._timeline: dict[tuple[str, str], tuple[list[float], list[tuple[frozenset, frozenset]]]] = {}
        self._sharing: dict[tuple[str, str, str], tuple[list[float], list[float | None]]] = {}

    def _build(self, key: tuple[str, str]) -> tuple[list[float], list[tuple[frozenset, frozenset]]]:
        points: list[tuple[float, int, dict]] = []
        for op in self.ops_of_user.get(key, []):
            points.append((op["t"], 0, op))
            points.append((op["t_end"], 1, op))
        points.sort(key=lambda point: (point[0], point[1]))
        true, unknown = set(self.initial.get(key, set())), set()
        in_flight: dict[str, int] = defaultdict(int)
        settled_unknown: set[str] = set()
        times, states = [-NEVER], [(frozenset(true), frozenset())]
        for t, is_end, op in points:
            channel = op["channel"]
            if not is_end:
                in_flight[channel] += 1
            else:
                in_flight[channel] -= 1
                if op.get("status") in APPLIED[op["op"]]:
                    settled_unknown.discard(channel)
                    (true.add if op["op"] == "add" else true.discard)(channel)
                elif op.get("status") is None or op["status"] >= 500:
                    settled_unknown.add(channel)
            unknown = {c for c, n in in_flight.items() if n > 0} | settled_unknown
            times.append(t)
            states.append((frozenset(true - unknown), frozenset(unknown)))
        return times, states

    def _timeline_of(self, tenant: str, user: str) -> tuple[list[float], list[tuple[frozenset, frozenset]]]:
        key = (tenant, user)
        if key not in self._timeline:
            self._timeline[key] = self._build(key)
        return self._timeline[key]

    def channels(self, tenant: str, user: str, t: float) -> tuple[frozenset, frozenset]:
        """(channels the user surely was a member of at `t`, channels whose membership is unknown)."""
        times, states = self._timeline_of(tenant, user)
        return states[bisect.bisect_right(times, t) - 1]

    def maybe_channels(self, tenant: str, user: str, t: float) -> frozenset:
        """Every channel the user may have been a member of at `t`, give or take the slack."""
        true, unknown = self.channels(tenant, user, t)
        near = {
            op["channel"]
            for op in self.ops_of_user.get((tenant, user), [])
            if op["t"] - self.slack <= t <= op["t_end"] + self.slack
        }
        return true | unknown | near

    def maybe_channels_between(self, tenant: str, user: str, start: float, end: float) -> frozenset:
        """Every channel the user may have been a member of at some moment of [start, end]."""
        found = set(self.maybe_channels(tenant, user, end))
        if start < end:
            times, _ = self._timeline_of(tenant, user)
            for at in [start, *times[bisect.bisect_right(times, start) : bisect.bisect_right(times, end)]]:
                found |= self.maybe_channels(tenant, user, at)
        return frozenset(found)

    def changed(self, tenant: str, user: str, start: float, end: float, channel: str | None = None) -> bool:
        """Whether a change of the user's memberships (in `channel`, if given) overlapped [start, end]."""
        ops = self.ops_of_user.get((tenant, user), [])
        return any(
            op["t"] <= end and op["t_end"] >= start and (channel is None or op["channel"] == channel) for op in ops
        )

    def sharing_since(self, tenant: str, watcher: str, user: str, t: float) -> float:
        """When the two last began to possibly share a channel, up to `t` (-inf: from the start)."""
        key = (tenant, watcher, user)
        if key not in self._sharing:
            self._sharing[key] = self._sharing_starts(tenant, watcher, user)
        moments, starts = self._sharing[key]
        since = starts[bisect.bisect_right(moments, t) - 1]
        # Apart at `t`: whatever sharing comes next starts after it.
        return t if since is None else since

    def _sharing_starts(self, tenant: str, watcher: str, user: str) -> tuple[list[float], list[float | None]]:
        ops = self.ops_of_user.get((tenant, watcher), []) + self.ops_of_user.get((tenant, user), [])
        moments = [-NEVER, *sorted({op["t"] for op in ops} | {op["t_end"] for op in ops})]
        starts: list[float | None] = []
        since: float | None = None
        for moment in moments:
            true_w, unknown_w = self.channels(tenant, watcher, moment)
            true_u, unknown_u = self.channels(tenant, user, moment)
            if not (true_w | unknown_w) & (true_u | unknown_u):
                since = None
            elif since is None:
                since = moment
            starts.append(since)
        return moments, starts


class History:
    """A history parsed into connections, faults, memberships and messages, for the invariants."""

    def __init__(self, records: list[dict]) -> None:
        self.records = records
        meta = next(record for record in records if record["k"] == "meta")
        self.meta = meta
        timings = meta["timings"]
        self.timings = Timings(
            grace=timings["grace_ms"] / 1000,
            ttl=timings["ttl_ms"] / 1000,
            refresh=timings["refresh_ms"] / 1000,
            margin=timings["margin_ms"] / 1000,
            slack=meta.get("slack_s", 3.0),
        )
        self.tenants: dict[str, dict] = meta["tenants"]
        self.user_tenants: dict[str, set[str]] = defaultdict(set)
        self.channel_tenant: dict[str, str] = {}
        for tenant, world in self.tenants.items():
            for user in world["users"]:
                self.user_tenants[user].add(tenant)
            for channel in world["channels"]:
                self.channel_tenant[channel] = tenant
        self.conns: dict[str, Conn] = {}
        self.faults: list[Fault] = []
        # The stalls of each connection's reader, by connection id (read for every frame).
        self.stalls: dict[str, list[Fault]] = defaultdict(list)
        self.ops: list[dict] = []
        self.acks: list[tuple[float, str, dict]] = []
        self.sends: list[tuple[float, str, dict]] = []
        self.checkpoints: list[float] = []
        self.logs: list[dict] = []
        self.log_lines_scanned = 0
        # What the checks saw that the contract allows but a reader should know (counts).
        self.observations: dict[str, int] = defaultdict(int)
        self.end = 0.0
        for record in records:
            self._take(record)
        self.memberships = Memberships([tuple(member) for member in meta["members"]], self.ops, self.timings.slack)
        # Per (tenant, user): sorted times of every open, ack and close of their connections.
        self.conn_events: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.conns_of: dict[tuple[str, str], list[Conn]] = defaultdict(list)
        for conn in self.conns.values():
            key = (conn.tenant, conn.user)
            self.conns_of[key].append(conn)
            events = self.conn_events[key]
            events.append(conn.t_open)
            if conn.t_ack is not None:
                events.append(conn.t_ack)
            if conn.t_close != NEVER:
                events.append(conn.t_close)
        for events in self.conn_events.values():
            events.sort()

    def _take(self, record: dict) -> None:
        kind = record["k"]
        t = record.get("t", 0.0)
        self.end = max(self.end, record.get("t_end", t))
        if kind == "open":
            self.conns[record["conn"]] = Conn(
                record["conn"], record["tenant"], record["user"], record.get("cursor"), record["t"]
            )
        elif kind == "close":
            conn = self.conns[record["conn"]]
            conn.t_close = min(conn.t_close, t)
        elif kind == "recv":
            self._frame(self.conns[record["conn"]], t, record["frame"])
        elif kind == "send":
            self.sends.append((t, record["conn"], record["frame"]))
        elif kind == "member":
            self.ops.append(record)
        elif kind == "fault":
            fault = Fault(record["fault"], t, record["t_end"], record.get("target"))
            self.faults.append(fault)
            if fault.local and fault.target is not None:
                self.stalls[fault.target].append(fault)
        elif kind == "checkpoint":
            self.checkpoints.append(t)
        elif kind == "log":
            self.logs.append(record)
        elif kind == "logscan":
            self.log_lines_scanned += record["lines"]

    def _frame(self, conn: Conn, t: float, frame: dict) -> None:
        kind, payload = frame.get("type"), frame.get("payload") or {}
        if kind == "connection.ack":
            conn.t_ack = t
        elif kind == "presence.snapshot" and conn.snapshot_t is None:
            conn.snapshot_t = t
            conn.snapshot = frozenset(payload.get("online", []))
        elif kind == "presence.changed":
            conn.changes[payload["user"]].append((t, payload["state"]))
        elif kind == "message.created":
            conn.messages[payload["channel"]].append((t, payload["seq"]))
        elif kind == "message.ack":
            self.acks.append((t, conn.id, payload))

    # ── the ground truth ────────────────────────────────────────────────────
    def online(self, tenant: str, user: str, t: float) -> bool:
        """Whether the user had a connection open at `t`, as their clients saw it."""
        return any(conn.t_ack is not None and conn.t_ack <= t < conn.t_close for conn in self.conns_of[(tenant, user)])

    def connected_throughout(self, tenant: str, user: str, start: float, end: float) -> bool:
        """Whether the user's connections, together, covered every instant of [start, end]."""
        spans = sorted((conn.t_ack, conn.t_close) for conn in self.conns_of[(tenant, user)] if conn.t_ack is not None)
        reached = start
        for begin, finish in spans:
            if begin > reached:
                break
            reached = max(reached, finish)
            if reached > end:
                return True
        return False

    def steady(self, tenant: str, user: str, start: float, end: float) -> bool:
        """No connection of the user opened, was acknowledged or closed in (start, end]."""
        events = self.conn_events.get((tenant, user), [])
        return bisect.bisect_right(events, end) == bisect.bisect_right(events, start)

    def global_fault(self, start: float, end: float, longer_than: float = 0.0) -> Fault | None:
        """A deployment-wide fault overlapping [start, end] (lasting longer than `longer_than`)."""
        return next(
            (
                fault
                for fault in self.faults
                if not fault.local and fault.overlaps(start, end) and fault.t_end - fault.t > longer_than
            ),
            None,
        )

    def sent_from(self, conn: Conn, t: float) -> float:
        """The earliest moment a frame `conn` read at `t` may have been sent.

        A reader that stalled reads, as it resumes, what its instance wrote to the socket since
        the stall began.
        """
        slack = self.memberships.slack
        return min(
            (stall.t for stall in self.stalls.get(conn.id, ()) if stall.t <= t <= stall.t_end + slack), default=t
        )

    def stalled(self, start: float, end: float, conn: Conn | None = None, user: str | None = None) -> bool:
        """Whether a stalled reader (this connection, or any of this user's) overlapped [start, end]."""
        for fault in self.faults:
            if not fault.local or not fault.overlaps(start, end):
                continue
            stalled = self.conns.get(fault.target or "")
            if stalled and (stalled is conn or (user is not None and stalled.user == user)):
                return True
        return False

    def view(self, conn: Conn, user: str, t: float) -> bool:
        """Whether `conn` believed `user` online at `t`: its snapshot, then every change in order.

        A watcher forgets a user it stops sharing every channel with (a removal sends nothing),
        so what it knows of them starts again when they share one again.
        """
        since = self.memberships.sharing_since(conn.tenant, conn.user, user, t)
        if conn.snapshot_t is not None and since <= conn.snapshot_t:
            state, start = user in conn.snapshot, conn.snapshot_t
        else:
            state, start = False, since
        for when, change in conn.changes.get(user, []):
            if when > t:
                break
            if when >= start:
                state = change == "online"
        return state


# ── excerpts ──────────────────────────────────────────────────────────────────
def excerpt(history: History, keep: Callable[[dict], bool], start: float, end: float) -> list[dict]:
    """The records `keep` selects within [start, end], and the faults overlapping it: the last few."""
    chosen = []
    for record in history.records:
        t = record.get("t", 0.0)
        overlapping_fault = record["k"] == "fault" and record["t"] <= end and record["t_end"] >= start
        if overlapping_fault or (start <= t <= end and keep(record)):
            chosen.append(record)
    return chosen[-EXCERPT_RECORDS:]


def about_user(conn_ids: set[str], tenant: str, user: str) -> Callable[[dict], bool]:
    """Records of these connections that concern `user`, and `user`'s own opens, closes and membership changes."""

    def keep(record: dict) -> bool:
        if record["k"] == "member":
            return record["tenant"] == tenant and record["user"] == user
        if record["k"] in ("open", "close"):
            return record["conn"] in conn_ids or record["conn"].split("#")[0] == f"{tenant}/{user}"
        if record["k"] == "recv" and record["conn"] in conn_ids:
            payload = record["frame"].get("payload") or {}
            return payload.get("user") == user or user in payload.get("online", ())
        return False

    return keep


# ── the invariants ────────────────────────────────────────────────────────────
def check_convergence(history: History) -> tuple[list[Violation], int]:
    """Once faults have healed for TTL + grace + 2 refreshes, every watcher's view equals the truth.

    Sampled every few seconds and at each checkpoint. A user whose connections changed within
    the settle time, or whose memberships (or the watcher's) changed, is not yet owed a settled
    view; a stalled reader neither watches nor is watched while it stalls.
    """
    timings = history.timings
    violations, checks, seen = [], 0, set()
    samples = [t * SAMPLE_EVERY for t in range(1, int(history.end / SAMPLE_EVERY) + 1)]
    for sample in sorted(set(samples) | set(history.checkpoints)):
        if history.global_fault(sample - timings.converge, sample):
            continue
        window = (sample - timings.settle, sample)
        # Per tenant and channel, the members whose presence every co-member must know by now.
        settled: dict[str, dict[str, set[str]]] = {}
        truth: dict[tuple[str, str], bool] = {}
        for tenant, world in history.tenants.items():
            settled[tenant] = defaultdict(set)
            for user in world["users"]:
                true_u, unknown_u = history.memberships.channels(tenant, user, sample)
                if unknown_u or not history.steady(tenant, user, *window):
                    continue
                if history.memberships.changed(tenant, user, *window):
                    continue
                if history.stalled(sample - timings.converge, sample, user=user):
                    continue
                truth[(tenant, user)] = history.online(tenant, user, sample)
                for channel in true_u:
                    settled[tenant][channel].add(user)
        for conn in history.conns.values():
            if conn.snapshot_t is None or conn.snapshot_t > sample - 1.0 or conn.t_close <= sample:
                continue
            if history.stalled(sample - timings.converge, sample, conn=conn):
                continue
            if history.memberships.changed(conn.tenant, conn.user, *window):
                continue
            true_w, unknown_w = history.memberships.channels(conn.tenant, conn.user, sample)
            if unknown_w:
                continue
            subjects = set().union(*(settled[conn.tenant].get(channel, set()) for channel in true_w))
            for user in sorted(subjects):
                if (conn.id, user) in seen:
                    continue
                checks += 1
                online = truth[(conn.tenant, user)]
                believed = history.view(conn, user, sample)
                if online != believed:
                    seen.add((conn.id, user))
                    violations.append(
                        Violation(
                            "convergence",
                            f"at t={sample:.1f}s connection {conn.id} believed {user} "
                            f"{'online' if believed else 'offline'}, but {user} was "
                            f"{'online' if online else 'offline'} and steady for {timings.settle:.1f}s, "
                            f"with no fault for {timings.converge:.1f}s",
                            scope=(about_user({conn.id}, conn.tenant, user), sample - 3 * timings.converge, sample),
                        )
                    )
    return violations, checks


def check_no_false_offline(history: History) -> tuple[list[Violation], int]:
    """A user connected throughout is never reported offline, unless a fault longer than the TTL excuses it.

    "Throughout" is the slack before the frame arrived: an `offline` published while the user was
    away can still be on its way when they are back.
    """
    timings = history.timings
    violations, checks = [], 0
    for conn in history.conns.values():
        for user, changes in conn.changes.items():
            for when, state in changes:
                if state != "offline":
                    continue
                checks += 1
                if not history.connected_throughout(conn.tenant, user, when - timings.slack, when):
                    continue
                window = (when - timings.converge, when)
                if history.global_fault(*window, longer_than=timings.ttl):
                    continue
                if history.stalled(*window, conn=conn) or history.stalled(*window, user=user):
                    continue
                violations.append(
                    Violation(
                        "no_false_offline",
                        f"at t={when:.2f}s connection {conn.id} was told {user} is offline while {user} "
                        "was connected throughout, with no fault longer than the TTL",
                        scope=(about_user({conn.id}, conn.tenant, user), when - timings.converge, when),
                    )
                )
    return violations, checks


def check_one_frame_per_transition(history: History) -> tuple[list[Violation], int]:
    """A watcher hears each transition once: never the same state twice in a row, outside fault windows."""
    timings = history.timings
    violations, checks = [], 0
    for conn in history.conns.values():
        for user, changes in conn.changes.items():
            for (first, state), (second, again) in itertools.pairwise(changes):
                checks += 1
                if state != again:
                    continue
                if history.global_fault(first - timings.converge, second):
                    continue
                if history.stalled(first - timings.converge, second, conn=conn) or history.stalled(
                    first - timings.converge, second, user=user
                ):
                    continue
                span = (first - timings.slack, second + timings.slack)
                if history.memberships.changed(conn.tenant, user, *span) or history.memberships.changed(
                    conn.tenant, conn.user, *span
                ):
                    continue
                violations.append(
                    Violation(
                        "one_frame_per_transition",
                        f"connection {conn.id} was told {user} is {state} twice in a row "
                        f"(t={first:.2f}s and t={second:.2f}s)",
                        scope=(about_user({conn.id}, conn.tenant, user), first - timings.settle, second),
                    )
                )
    return violations, checks


def _messages_of(conn_id: str, channel: str) -> Callable[[dict], bool]:
    def keep(record: dict) -> bool:
        if record["k"] in ("open", "close"):
            return record["conn"] == conn_id
        if record["k"] in ("recv", "send"):
            payload = record["frame"].get("payload") or {}
            return payload.get("channel") == channel and (
                record["conn"] == conn_id or record["frame"].get("type") == "message.ack"
            )
        return record["k"] == "member" and record["channel"] == channel

    return keep


def check_messages(history: History) -> tuple[list[Violation], int]:
    """Every acked message reaches every member connected or resuming afterwards once, in seq order, gapless."""
    timings = history.timings
    slack = timings.slack
    violations, checks = [], 0

    def report(conn: Conn, channel: str, summary: str, start: float, end: float) -> None:
        violations.append(Violation("messages", summary, scope=(_messages_of(conn.id, channel), start, end)))

    def excused(conn: Conn, channel: str, start: float, end: float) -> bool:
        return bool(
            history.global_fault(start - slack, end + slack)
            or history.stalled(start - slack, end + slack, conn=conn)
            or history.memberships.changed(conn.tenant, conn.user, start - slack, end + slack, channel)
        )

    # One message per (channel, author, idem_key), and one id per (channel, seq).
    by_idem: dict[tuple, set[int]] = defaultdict(set)
    for _, conn_id, payload in history.acks:
        conn = history.conns[conn_id]
        by_idem[(payload["channel"], conn.tenant, conn.user, payload["idem_key"])].add(payload["seq"])
    for (channel, _, user, idem_key), seqs in by_idem.items():
        checks += 1
        if len(seqs) > 1:
            violations.append(
                Violation("messages", f"{user}'s idem_key {idem_key} in {channel} was acked as seqs {sorted(seqs)}")
            )

    # When each message was first acked.
    first_acks: dict[tuple[str, int], float] = {}
    # When it was first sent: it was stored in between, which a reader stalled past its ack
    # stretches to seconds.
    first_sends: dict[tuple[str, str], float] = {}
    for when, conn_id, frame in history.sends:
        if frame.get("type") == "message.send":
            first_sends.setdefault((conn_id, (frame.get("payload") or {}).get("idem_key")), when)
    sent_at: dict[tuple[str, int], float] = {}
    for when, conn_id, payload in history.acks:
        key = (payload["channel"], payload["seq"])
        first_acks[key] = min(when, first_acks.get(key, when))
        sent = first_sends.get((conn_id, payload["idem_key"]), when)
        sent_at[key] = min(sent, sent_at.get(key, sent))

    def owed(conn: Conn, channel: str, seq: int, end: float) -> bool:
        """Whether a gap's missing message had to reach `conn`, given that one after it did at `end`."""
        # Acked less than the slack before the close, it may have been on its way: live messages
        # overtake each other (the live check below judges the same span).
        if first_acks.get((channel, seq), end) > conn.t_close - slack:
            return False
        # Sent before a connection without a cursor for the channel was in, it may have been
        # stored and sent out before the connection listened, though an older one's frame came late.
        return channel in (conn.cursor or {}) or sent_at.get((channel, seq), end) >= (conn.t_ack or conn.t_open)

    received: dict[tuple[str, str], set[int]] = {}
    for conn in history.conns.values():
        for channel, arrivals in conn.messages.items():
            received[(conn.id, channel)] = {seq for _, seq in arrivals}
            first_arrival: dict[int, float] = {}
            highest = 0
            for when, seq in arrivals:
                checks += 1
                if seq in first_arrival:
                    summary = f"connection {conn.id} got seq {seq} of {channel} twice"
                    report(conn, channel, summary, first_arrival[seq], when)
                    continue
                if seq < highest:
                    # Live messages sent through different instances race each other on the channel
                    # layer: the contract orders a resume's backlog, and clients order the rest.
                    history.observations["live_reorders"] += 1
                first_arrival[seq] = when
                highest = max(highest, seq)
            # No gap: every seq between the first and the last this connection got, in any order.
            for low, high in itertools.pairwise(sorted(first_arrival)):
                if high == low + 1:
                    continue
                start, end = sorted((first_arrival[low], first_arrival[high]))
                if any(owed(conn, channel, seq, end) for seq in range(low + 1, high)) and not excused(
                    conn, channel, start, end
                ):
                    report(
                        conn,
                        channel,
                        f"connection {conn.id} got seqs {low} and {high} of {channel}, and never {low + 1}..{high - 1}",
                        start,
                        end,
                    )

    # Per channel, the messages in the order they were first acked, and the highest seq by then.
    stored_at: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for (channel, seq), when in sorted(first_acks.items(), key=lambda item: item[1]):
        stored_at[channel].append((when, seq))
    highest: dict[str, list[int]] = {
        channel: list(itertools.accumulate((seq for _, seq in stored), max)) for channel, stored in stored_at.items()
    }

    def stored_before(channel: str, moment: float) -> int:
        stored = stored_at.get(channel, [])
        index = bisect.bisect_left([when for when, _ in stored], moment)
        return highest[channel][index - 1] if index else 0

    # Resumes: the first message of a resumed channel is the one after the cursor.
    for conn in history.conns.values():
        if not conn.cursor or conn.t_ack is None:
            continue
        for channel, position in conn.cursor.items():
            true, _ = history.memberships.channels(conn.tenant, conn.user, conn.t_open)
            if channel not in true or excused(conn, channel, conn.t_open, conn.t_ack):
                continue
            arrivals = conn.messages.get(channel, [])
            checks += 1
            # The backlog (what was surely stored before the connect) comes in seq order, before live ones.
            backlog = sorted(
                seq for _, seq in arrivals if position < seq <= stored_before(channel, conn.t_open - slack)
            )
            leading = [seq for _, seq in arrivals[: len(backlog)]]
            if leading != backlog:
                report(
                    conn,
                    channel,
                    f"connection {conn.id} resumed {channel} from {position}: its backlog {backlog} "
                    f"came as {leading} first, not in seq order before live messages",
                    conn.t_open,
                    arrivals[len(backlog) - 1][0],
                )
            # Only when the next one was surely stored before the connect: stored after it, it is a
            # live message, and live ones may overtake each other (counted as live reorders).
            if arrivals and arrivals[0][1] > position + 1 and stored_before(channel, conn.t_open - slack) > position:
                when, seq = arrivals[0]
                if not excused(conn, channel, conn.t_open, when):
                    report(
                        conn,
                        channel,
                        f"connection {conn.id} resumed {channel} from {position} and got {seq} first",
                        conn.t_open,
                        when,
                    )
            newest = stored_before(channel, conn.t_open - slack)
            if (
                newest > position
                and not arrivals
                and conn.t_close > conn.t_ack + slack
                and not excused(conn, channel, conn.t_open, conn.t_ack + slack)
            ):
                report(
                    conn,
                    channel,
                    f"connection {conn.id} resumed {channel} from {position} while seq {newest} "
                    "was stored, and was sent none of them",
                    conn.t_open,
                    conn.t_ack + slack,
                )

    # Live delivery: every member's connection open from the send to the ack got the message (a
    # resend's ack answers the first send's message: it was stored between the first send and
    # the first ack).
    for channel, stored in stored_at.items():
        times = [when for when, _ in stored]
        for conn in history.conns.values():
            if conn.tenant != history.channel_tenant.get(channel) or conn.snapshot_t is None:
                continue
            low = bisect.bisect_left(times, conn.snapshot_t + slack)
            high = bisect.bisect_right(times, conn.t_close - slack)
            for when, seq in stored[low:high]:
                since = sent_at[(channel, seq)]
                if since < conn.snapshot_t + slack:
                    continue
                true, _ = history.memberships.channels(conn.tenant, conn.user, when)
                before, _ = history.memberships.channels(conn.tenant, conn.user, since)
                if channel not in true or channel not in before or excused(conn, channel, since, when):
                    continue
                checks += 1
                if seq not in received.get((conn.id, channel), set()):
                    report(
                        conn,
                        channel,
                        f"connection {conn.id} of a member was open around the ack of seq {seq} of {channel} "
                        f"(t={when:.2f}s) and never got it",
                        when - slack,
                        when + slack,
                    )
    return violations, checks


def _names(frame: dict) -> tuple[set[str], set[str]]:
    """(user ids, channel ids) a server frame names."""
    kind, payload = frame.get("type"), frame.get("payload") or {}
    users, channels = set(), set()
    if kind == "connection.ack":
        users.add(payload.get("user"))
        channels.update(payload.get("channels", []))
    elif kind == "presence.snapshot":
        users.update(payload.get("online", []))
    elif kind == "presence.changed":
        users.add(payload.get("user"))
    elif kind == "message.created":
        users.add(payload.get("user"))
        channels.add(payload.get("channel"))
    elif kind == "message.ack":
        channels.add(payload.get("channel"))
    return users - {None}, channels - {None}


def check_walls_and_reach(history: History) -> tuple[list[Violation], list[Violation], int, int]:
    """No frame names another tenant's user or channel; presence and messages reach only who shares.

    Reach is judged generously: a membership is counted from the moment its change was asked
    for until the slack after it was answered, and a frame a stalled reader read as it resumed
    from the moment the stall began.
    """
    walls, reach, wall_checks, reach_checks = [], [], 0, 0
    for record in history.records:
        if record["k"] != "recv":
            continue
        conn = history.conns[record["conn"]]
        when, frame = record["t"], record["frame"]
        world = history.tenants[conn.tenant]
        users, channels = _names(frame)
        wall_checks += 1
        foreign_users = {u for u in users if conn.tenant not in history.user_tenants.get(u, set())}
        foreign_channels = {c for c in channels if history.channel_tenant.get(c) != conn.tenant}
        if foreign_users or foreign_channels:
            walls.append(
                Violation(
                    "tenant_walls",
                    f"connection {conn.id} of tenant {conn.tenant} got a {frame.get('type')} naming "
                    f"{sorted(foreign_users | foreign_channels)}, not of its tenant",
                    [record],
                )
            )
            continue
        kind = frame.get("type")
        sent = history.sent_from(conn, when)
        mine = history.memberships.maybe_channels_between(conn.tenant, conn.user, sent, when)
        if kind in ("presence.changed", "presence.snapshot"):
            for user in users:
                reach_checks += 1
                if not mine & history.memberships.maybe_channels_between(conn.tenant, user, sent, when):
                    reach.append(
                        Violation(
                            "reach",
                            f"connection {conn.id} ({conn.user}) got {kind} about {user}, "
                            "with whom it shared no channel",
                            scope=(about_user({conn.id}, conn.tenant, user), when - 10, when),
                        )
                    )
        elif kind == "message.created":
            reach_checks += 1
            channel = frame["payload"]["channel"]
            if channel not in mine and channel in world["channels"]:
                reach.append(
                    Violation(
                        "reach",
                        f"connection {conn.id} ({conn.user}) got a message of {channel}, not one of its channels",
                        scope=(_messages_of(conn.id, channel), when - 10, when),
                    )
                )
    return walls, reach, wall_checks, reach_checks


def check_no_traceback(history: History) -> tuple[list[Violation], int]:
    """No instance logged a traceback."""
    violations = [
        Violation("no_traceback", f"instance {line['instance']} logged a traceback", [line]) for line in history.logs
    ]
    return violations, history.log_lines_scanned


def operations(history: History) -> dict[str, int]:
    """What the clients did: the positive side of every "nothing went wrong"."""
    counts: dict[str, int] = defaultdict(int)
    for conn in history.conns.values():
        counts["connects"] += 1
        counts["acked_connects"] += conn.t_ack is not None
        counts["resumes"] += bool(conn.cursor)
        counts["presence_frames"] += sum(len(changes) for changes in conn.changes.values())
        counts["messages_received"] += sum(len(arrivals) for arrivals in conn.messages.values())
    for record in history.records:
        if record["k"] == "close":
            counts[f"closes_by_{record['by']}"] += 1
    counts["messages_sent"] = sum(1 for _, _, frame in history.sends if frame.get("type") == "message.send")
    counts["messages_acked"] = len(history.acks)
    counts["membership_changes"] = len(history.ops)
    counts.update(history.observations)
    return dict(counts)


def check(records: list[dict]) -> Report:
    """Hold a whole history against every invariant."""
    history = History(records)
    results: dict[str, tuple[list[Violation], int]] = {
        "convergence": check_convergence(history),
        "no_false_offline": check_no_false_offline(history),
        "one_frame_per_transition": check_one_frame_per_transition(history),
        "messages": check_messages(history),
    }
    walls, reach, wall_checks, reach_checks = check_walls_and_reach(history)
    results["tenant_walls"] = (walls, wall_checks)
    results["reach"] = (reach, reach_checks)
    results["no_traceback"] = check_no_traceback(history)
    violations = [v for name in INVARIANTS for v in results[name][0][:KEEP_PER_INVARIANT]]
    for violation in violations:
        if violation.scope is not None:
            violation.excerpt = excerpt(history, *violation.scope)
            violation.scope = None
    faults: dict[str, int] = defaultdict(int)
    for fault in history.faults:
        faults[fault.kind] += 1
    return Report(
        seed=history.meta.get("seed"),
        replay=history.meta.get("replay", ""),
        violations=violations,
        checks={name: results[name][1] for name in INVARIANTS},
        operations=operations(history),
        faults=dict(faults),
        found={name: len(results[name][0]) for name in INVARIANTS},
    )


def describe(report: Report, path: str) -> str:
    """The violations as a person reads them: seed, invariant, excerpt, and how to replay it."""
    lines = []
    for violation in report.violations:
        lines.append(f"VIOLATION seed={report.seed} invariant={violation.invariant}")
        lines.append(f"  {violation.summary}")
        for record in violation.excerpt:
            lines.append(f"    {record}")
        lines.append(f"  replay: {report.replay}")
        lines.append(f"  re-check: python -m chaos check {path}")
    return "\n".join(lines)
