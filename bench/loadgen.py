"""The load generator: a separate process driving real WebSocket clients with asyncio.

`python -m bench.loadgen` reads one JSON job on stdin's first line, runs it, and
writes JSON lines on stdout: `{"event": "ready", ...}` when a held load is in place
(the orchestrator then measures the server and answers with any line on stdin to
let go), and `{"event": "result", ...}` at the end. Progress goes to stderr.

Scenarios:
- `idle`: open N connections (bounded concurrency), wait for every ack, hold.
- `notify`: watchers connect to one instance; subjects connect to another at a fixed
  rate; latency = subject's connect start → the watcher receives its `online`.
- `churn`: connect/disconnect pairs at a fixed rate across two instances, watchers
  on both; reports online-notification latency and presence frames delivered/s.
- `ceiling`: watchers connect to a frame-pushing server; reports frames/s received.
- `burst`: watchers connect to Relay; the orchestrator injects transitions into their channel's
  group; reports frames/s received (the same burst as `ceiling`, through Relay).
- `slow_reader`: healthy members of one channel connect, then one member that stops reading (a
  raw socket that never reads after its handshake); the first healthy member sends messages to the
  channel, each once every healthy member has the one `window` before it; reports what the
  healthy members received.
- `module:function`: a scenario a phase module keeps beside its phase (bench/fairness.py).
"""

import asyncio
import importlib
import json
import random
import resource
import socket
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import websockets
from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def progress(message: str) -> None:
    print(f"  loadgen: {message}", file=sys.stderr, flush=True)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile; 0 for an empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


# How long a connection may wait for its `connection.ack`.
ACK_SECONDS = 60


def where(url: str) -> str:
    """A server's URL without its query string (which holds the token)."""
    return url.split("?", 1)[0]


async def connect(url: str, **options: Any) -> Any:
    """A connection to `url`; a failure says which server refused it and how."""
    try:
        return await websockets.connect(url, open_timeout=ACK_SECONDS, ping_interval=None, proxy=None, **options)
    except Exception as error:
        raise RuntimeError(f"{where(url)}: the connect failed: {type(error).__name__}: {error}") from error


async def until_acked(acked: asyncio.Event, ws: Any, url: str) -> None:
    """Wait for the ack; a timeout says which server kept it, and whether the socket was closed."""
    try:
        await asyncio.wait_for(acked.wait(), ACK_SECONDS)
    except TimeoutError:
        state = "still open" if ws.close_code is None else f"closed {ws.close_code} {ws.close_reason!r}"
        raise RuntimeError(f"{where(url)}: no connection.ack within {ACK_SECONDS} s ({state})") from None


async def wait_line() -> str:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, sys.stdin.readline)


class Watcher:
    """A connection that records when each presence transition arrives, by (user, state).

    Relay's frames (`presence.snapshot`, `presence.changed`) and the peer's (`presence`: the
    room's whole member list, bench/peers/asgi.py) alike: a peer frame that adds or drops a
    user counts as that user's transition. `view` is who the client believes online (Relay:
    the snapshot and every change since), kept with `expect` or `track`; `full_at`, when it last
    became `expect` users; `offline`, how many `offline` frames came for each user, when tracking.
    """

    def __init__(self, url: str, heartbeat: float = 0.0, expect: int = 0, track: bool = False) -> None:
        self.url = url
        self.ws: Any = None
        self.seen: dict[tuple[str, str], float] = {}
        self.frames = 0
        self.bytes = 0
        self.last = 0.0
        self.acked = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.heartbeat = heartbeat
        self.expect = expect
        self.tracking = track or bool(expect)
        self.view: set[str] = set()
        self.offline: dict[str, int] = defaultdict(int)
        self.full_at = 0.0
        self.snapshot_bytes = 0
        self.rooms: dict[str, set[str]] = {}
        self.beating: asyncio.Task | None = None

    async def start(self) -> None:
        # proxy=None on every connect here: the clients talk straight to the servers under test,
        # and left to its default `websockets` looks for a proxy on each connect by walking the
        # whole environment (urllib's getproxies_environment), ≈ 6 % of the load generator's CPU
        # in a churn step, on the two cores the servers share with it.
        self.ws = await connect(self.url, max_queue=None)
        self.task = asyncio.create_task(self._read())
        await until_acked(self.acked, self.ws, self.url)
        if self.heartbeat:
            self.beating = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        """The peer's keep-alive: every frame a client sends touches its presence rows."""
        try:
            while True:
                await asyncio.sleep(self.heartbeat)
                await self.ws.send('"heartbeat"')
        except websockets.ConnectionClosed:
            pass

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                now = time.perf_counter()
                frame = orjson.loads(raw)
                kind = frame["type"]
                if kind == "presence.changed":
                    self.frames += 1
                    self.bytes += len(raw)
                    self.last = now
                    payload = frame["payload"]
                    self.seen.setdefault((payload["user"], payload["state"]), now)
                    if self.tracking:
                        if payload["state"] == "online":
                            self.view.add(payload["user"])
                        else:
                            self.view.discard(payload["user"])
                            self.offline[payload["user"]] += 1
                elif kind == "presence":
                    self.frames += 1
                    self.bytes += len(raw)
                    self.last = now
                    self._members(frame["payload"], now)
                elif kind == "presence.snapshot":
                    self.snapshot_bytes = max(self.snapshot_bytes, len(raw))
                    if self.tracking:
                        self.view = set(frame["payload"]["online"])
                elif kind == "connection.ack":
                    self.acked.set()
                if self.expect:
                    if len(self.view) != self.expect:
                        self.full_at = 0.0
                    elif not self.full_at:
                        self.full_at = now
        except websockets.ConnectionClosed:
            pass

    def _members(self, payload: dict, now: float) -> None:
        members = set(payload["members"])
        before = self.rooms.get(payload["channel_name"], set())
        for user in members - before:
            self.seen.setdefault((user, "online"), now)
        for user in before - members:
            self.seen.setdefault((user, "offline"), now)
        self.rooms[payload["channel_name"]] = members

    async def close(self) -> None:
        await self.ws.close()


async def _open_many(
    urls: list[str], concurrency: int, heartbeat: float = 0.0, rate: float = 0.0, expect: int = 0, track: bool = False
) -> list[Watcher]:
    """Open these connections, `concurrency` at a time or, with `rate`, started at that rate per second."""
    watchers = [Watcher(url, heartbeat, expect, track) for url in urls]
    semaphore = asyncio.Semaphore(concurrency if not rate else len(urls) or 1)
    started = time.perf_counter()
    done = 0

    async def one(index: int, watcher: Watcher) -> None:
        nonlocal done
        if rate:
            await asyncio.sleep(max(0.0, started + index / rate - time.perf_counter()))
        async with semaphore:
            await watcher.start()
        done += 1
        if done % 1000 == 0:
            progress(f"{done}/{len(watchers)} connections acknowledged")

    await asyncio.gather(*(one(index, watcher) for index, watcher in enumerate(watchers)))
    return watchers


async def idle(job: dict) -> None:
    started = time.perf_counter()
    watchers = await _open_many(job["urls"], job.get("concurrency", 200), rate=job.get("rate", 0.0))
    emit("ready", connections=len(watchers), seconds=round(time.perf_counter() - started, 2))
    await wait_line()
    await asyncio.gather(*(watcher.close() for watcher in watchers), return_exceptions=True)
    emit("result", connections=len(watchers))


async def _subject_cycle(url: str, hold: float, opened: dict, key: str) -> None:
    """Connect a subject, note when the connect started, wait for the ack, hold, close."""
    opened[key] = time.perf_counter()
    ws = await connect(url)
    try:
        await asyncio.wait_for(ws.recv(), ACK_SECONDS)
        await asyncio.sleep(hold)
    finally:
        await ws.close()


async def _paced(
    subjects: list[tuple[str, str]], rate: float, hold: float, opened: dict
) -> tuple[float, asyncio.Future]:
    """Start subject cycles at `rate` per second.

    Returns the rate actually achieved and a future of every cycle's end (the last closes).
    """
    tasks = []
    started = time.perf_counter()
    for index, (user, url) in enumerate(subjects):
        due = started + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_subject_cycle(url, hold, opened, user)))
    elapsed = time.perf_counter() - started
    return (len(subjects) / elapsed if elapsed > 0 else rate), asyncio.gather(*tasks, return_exceptions=True)


async def _ended(cycles: asyncio.Future) -> None:
    """Wait for every subject cycle; report the failures."""
    failures = [result for result in await cycles if isinstance(result, BaseException)]
    if failures:
        progress(f"{len(failures)} subject connections failed, first: {failures[0]!r}")


def _latencies(watchers_by_user: dict[str, list[Watcher]], opened: dict, state: str) -> tuple[list[float], int]:
    """Per (subject, watcher) latency in ms of the `state` frame, and how many never arrived."""
    values, missing = [], 0
    for user, started in opened.items():
        for watcher in watchers_by_user[user]:
            arrived = watcher.seen.get((user, state))
            if arrived is None:
                missing += 1
            else:
                values.append((arrived - started) * 1000)
    return values, missing


async def _open_watchers(job: dict) -> tuple[list[Watcher], dict[str, list[Watcher]]]:
    """Open the job's watchers; return them and, for each subject, the watchers that share its channel."""
    all_watchers = await _open_many(
        [w["url"] for w in job["watchers"]], job.get("concurrency", 200), heartbeat=job.get("heartbeat", 0.0)
    )
    watchers_by_user: dict[str, list[Watcher]] = defaultdict(list)
    for spec, watcher in zip(job["watchers"], all_watchers, strict=True):
        for user in spec["subjects"]:
            watchers_by_user[user].append(watcher)
    return all_watchers, watchers_by_user


async def notify(job: dict) -> None:
    """Subjects on one instance, their watchers on another; latency of `online`."""
    all_watchers, watchers_by_user = await _open_watchers(job)
    progress(f"{len(all_watchers)} watchers ready; {len(job['subjects'])} subjects at {job['rate']}/s")
    opened: dict[str, float] = {}
    achieved, cycles = await _paced([(s["user"], s["url"]) for s in job["subjects"]], job["rate"], job["hold"], opened)
    await _ended(cycles)
    await asyncio.sleep(job.get("settle", 1.0))
    values, missing = _latencies(watchers_by_user, opened, "online")
    await asyncio.gather(*(w.close() for w in all_watchers), return_exceptions=True)
    emit(
        "result",
        p50_ms=round(percentile(values, 50), 2),
        p99_ms=round(percentile(values, 99), 2),
        mean_ms=round(statistics.fmean(values), 2) if values else 0.0,
        samples=len(values),
        missing=missing,
        achieved_rate=round(achieved, 1),
    )


async def churn(job: dict) -> None:
    """Connect/disconnect pairs at `rate`/s; online latency and presence frames delivered per second."""
    all_watchers, watchers_by_user = await _open_watchers(job)
    frames_before = sum(w.frames for w in all_watchers)
    bytes_before = sum(w.bytes for w in all_watchers)
    opened: dict[str, float] = {}
    # The measured window starts now: the harness reads every process's CPU from here.
    emit("started")
    cpu_started = time.process_time()
    started = time.perf_counter()
    achieved, cycles = await _paced([(s["user"], s["url"]) for s in job["subjects"]], job["rate"], job["hold"], opened)
    # Wait out the grace so each pair's `offline` is delivered and counted too. The window ends
    # there: a close the server is slow to finish (an overloaded step) does not stretch it.
    await asyncio.sleep(job.get("settle", 1.0))
    elapsed = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    frames = sum(w.frames for w in all_watchers) - frames_before
    received = sum(w.bytes for w in all_watchers) - bytes_before
    emit("ended")
    await _ended(cycles)
    values, missing = _latencies(watchers_by_user, opened, "online")
    _, offline_missing = _latencies(watchers_by_user, opened, "offline")
    await asyncio.gather(*(w.close() for w in all_watchers), return_exceptions=True)
    emit(
        "result",
        rate=job["rate"],
        achieved_rate=round(achieved, 1),
        p50_ms=round(percentile(values, 50), 2),
        p99_ms=round(percentile(values, 99), 2),
        missing_online=missing,
        missing_offline=offline_missing,
        frames=frames,
        # Each subject's `online` and `offline`, to every watcher of its channel.
        watcher_transitions=sum(2 * len(watchers_by_user[s["user"]]) for s in job["subjects"]),
        bytes_per_frame=round(received / frames, 1) if frames else 0.0,
        frames_per_s=round(frames / elapsed, 1) if elapsed else 0.0,
        seconds=round(elapsed, 2),
        cpu_seconds=round(cpu_seconds, 3),
    )


async def ceiling(job: dict) -> None:
    """Connect to the frame-pushing server, ask for a burst, count what arrives per second."""
    watchers = await _open_many(job["urls"], job.get("concurrency", 200))
    control = await websockets.connect(job["control_url"], ping_interval=None, proxy=None)
    started = time.perf_counter()
    await control.send(json.dumps({"frames": job["frames"]}))
    expected = job["frames"] * len(watchers)
    # Polled rather than signalled: the readers stay as cheap as in the other scenarios.
    while sum(w.frames for w in watchers) < expected and time.perf_counter() - started < job.get("timeout", 60):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    received = sum(w.frames for w in watchers)
    await control.close()
    await asyncio.gather(*(w.close() for w in watchers), return_exceptions=True)
    emit("result", frames=received, frames_per_s=round(received / elapsed, 1), seconds=round(elapsed, 3))


async def burst(job: dict) -> None:
    """Watchers on a Relay instance; on "go" the orchestrator injects a burst into their channel's group.

    Counts the `presence.changed` frames that arrive after "go" until every watcher has its
    `frames` or the timeout passes: Relay's fan-out capacity, without connects in the way.
    """
    watchers = await _open_many(job["urls"], job.get("concurrency", 200))
    # Their own and each other's `online` frames arrive while they connect; let them pass.
    await asyncio.sleep(job.get("settle", 1.0))
    before = sum(w.frames for w in watchers)
    emit("ready", connections=len(watchers))
    await wait_line()
    started = time.perf_counter()
    expected = before + job["frames"] * len(watchers)
    # Until every frame is in, or none came for a second (a layer that drops over capacity).
    quiet = job.get("quiet", 1.0)
    while sum(w.frames for w in watchers) < expected:
        now = time.perf_counter()
        last = max([w.last for w in watchers] + [started])
        if now - last > quiet or now - started > job.get("timeout", 60):
            break
        await asyncio.sleep(0.002)
    received = sum(w.frames for w in watchers) - before
    elapsed = max(w.last for w in watchers) - started if received else 0.0
    await asyncio.gather(*(w.close() for w in watchers), return_exceptions=True)
    emit(
        "result",
        frames=received,
        missing=expected - before - received,
        frames_per_s=round(received / elapsed, 1) if elapsed > 0 else 0.0,
        seconds=round(elapsed, 3),
    )


CREATED = b'{"type":"message.created"'


class Member:
    """A healthy member: counts its `message.created` frames, and tells the channel when each arrived everywhere."""

    def __init__(self, url: str, channel: "Delivery") -> None:
        self.url = url
        self.channel = channel
        self.ws: Any = None
        self.created = 0
        self.acked = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.ws = await connect(self.url, max_queue=None)
        self.task = asyncio.create_task(self._read())
        await until_acked(self.acked, self.ws, self.url)

    async def _read(self) -> None:
        try:
            while True:
                # Undecoded: 40 MB to each of 1,000 members would otherwise be mostly the decoding of it.
                raw = await self.ws.recv(decode=False)
                if raw.startswith(CREATED):
                    self.created += 1
                    self.channel.arrived(self.created)
                elif not self.acked.is_set() and raw.startswith(b'{"type":"connection.ack"'):
                    self.acked.set()
        except websockets.ConnectionClosed:
            pass


class Delivery:
    """How many members have each message (by its position), and a wait for all of them to have one."""

    def __init__(self, members: int) -> None:
        self.members = members
        self.count: dict[int, int] = defaultdict(int)
        self.everywhere: dict[int, asyncio.Event] = defaultdict(asyncio.Event)

    def arrived(self, position: int) -> None:
        self.count[position] += 1
        if self.count[position] == self.members:
            self.everywhere[position].set()

    async def wait(self, position: int, timeout: float) -> None:
        if position > 0:
            await asyncio.wait_for(self.everywhere[position].wait(), timeout)


def _stalled(url: str) -> socket.socket:
    """A WebSocket that completes its handshake and never reads again, with a 4 KiB receive window."""
    uri = parse_uri(url)
    client = ClientProtocol(uri)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Before connecting, so the window the kernel advertises stays small.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect((uri.host, uri.port))
    client.send_request(client.connect())
    sock.sendall(b"".join(client.data_to_send()))
    while client.state is State.CONNECTING:
        data = sock.recv(1024)
        if not data:
            raise RuntimeError("the stalled client's handshake was refused")
        client.receive_data(data)
    return sock


async def slow_reader(job: dict) -> None:
    """One stalled member among healthy ones; messages sent paced by the healthy ones only."""
    channel = Delivery(len(job["urls"]))
    members = [Member(url, channel) for url in job["urls"]]
    semaphore = asyncio.Semaphore(job.get("concurrency", 100))

    async def start(member: Member) -> None:
        async with semaphore:
            await member.start()

    await asyncio.gather(*(start(member) for member in members))
    sender = members[0]
    text = job["text"]
    window, timeout = job["window"], job.get("timeout", 60)
    sent = 0

    async def send(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            await channel.wait(sent + 1 - window, timeout)
            payload = {"idem_key": uuid.uuid4().hex, "channel": job["channel"], "text": text}
            await sender.ws.send(orjson.dumps({"type": "message.send", "payload": payload}).decode())
            sent += 1
        await channel.wait(sent, timeout)

    # The fan-out's own buffers reach their steady size before the measurement starts.
    await send(job["warmup"])
    before = [member.created for member in members]
    emit("ready", connections=len(members))
    await wait_line()
    stalled = await asyncio.get_running_loop().run_in_executor(None, _stalled, job["stalled_url"])
    started = time.perf_counter()
    try:
        await send(job["messages"])
    except TimeoutError:
        # A healthy member stopped receiving (cut loose too): what did arrive is the result.
        progress(f"message {sent} did not reach every healthy member in {timeout} s")
    elapsed = time.perf_counter() - started
    delivered = sum(member.created - seen for member, seen in zip(members, before, strict=True))
    stalled.close()
    await asyncio.gather(*(member.ws.close() for member in members), return_exceptions=True)
    emit(
        "result",
        delivered=delivered,
        expected=job["messages"] * len(members),
        seconds=round(elapsed, 2),
    )


async def _quiet(watchers: list[Watcher], quiet: float, timeout: float) -> None:
    """Until no presence frame has arrived for `quiet` seconds (the connects' own transitions are in)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        last = max([w.last for w in watchers] + [started])
        if time.perf_counter() - last > quiet:
            return
        await asyncio.sleep(0.05)


async def flicker(job: dict) -> None:
    """A subject closes and reconnects `gap` seconds later: the presence frames each watcher gets for it."""
    watchers = await _open_many([w["url"] for w in job["watchers"]], 50, heartbeat=job.get("heartbeat", 0.0))
    subject = Watcher(job["subject"]["url"], job.get("heartbeat", 0.0))
    await subject.start()
    await _quiet(watchers, 1.0, 30)
    before = sum(w.frames for w in watchers)
    await subject.close()
    await asyncio.sleep(job["gap"])
    again = Watcher(job["subject"]["url"], job.get("heartbeat", 0.0))
    await again.start()
    await asyncio.sleep(job["settle"])
    frames = sum(w.frames for w in watchers) - before
    user = job["subject"]["user"]
    online = sum(1 for w in watchers if (user, "online") in w.seen)
    await asyncio.gather(again.close(), *(w.close() for w in watchers), return_exceptions=True)
    emit("result", frames_per_watcher=round(frames / len(watchers), 3), watchers=len(watchers), saw_online=online)


async def dead_instance(job: dict) -> None:
    """Subjects on an instance the harness SIGKILLs; when their watchers, elsewhere, see each go offline.

    The harness sends the instant of the kill (time.monotonic(), the clock perf_counter reads here).
    """
    all_watchers, watchers_by_user = await _open_watchers(job)
    subjects = await _open_many(
        [s["url"] for s in job["subjects"]], job.get("concurrency", 200), heartbeat=job.get("heartbeat", 0.0)
    )
    await _quiet(all_watchers, 1.0, 120)
    emit("ready", watchers=len(all_watchers), subjects=len(subjects))
    killed = float(await wait_line())
    users = [s["user"] for s in job["subjects"]]
    pairs = [(user, watcher) for user in users for watcher in watchers_by_user[user]]
    deadline = killed + job.get("timeout", 120)
    # Polled, as in `ceiling`: the readers stay as cheap as in the other scenarios.
    while time.perf_counter() < deadline and any((u, "offline") not in w.seen for u, w in pairs):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    seen = [w.seen[(u, "offline")] - killed for u, w in pairs if (u, "offline") in w.seen]
    await asyncio.gather(*(w.close() for w in all_watchers), return_exceptions=True)
    emit(
        "result",
        pairs=len(pairs),
        missing=len(pairs) - len(seen),
        first_ms=round(min(seen) * 1000, 1) if seen else 0.0,
        last_ms=round(max(seen) * 1000, 1) if seen else 0.0,
        p50_ms=round(percentile(seen, 50) * 1000, 1),
    )


async def bigroom(job: dict) -> None:
    """Members connect and settle; on "go" each closes and reconnects, spread over `window` seconds (a deploy).

    Converged: every member's view (its snapshot and each change since) holds its `expect` users.
    """
    members = job["members"]
    old = await _open_many([m["url"] for m in members], job.get("concurrency", 100))
    await _quiet(old, 1.0, job.get("timeout", 300))
    emit("ready", connections=len(old), frames=sum(w.frames for w in old))
    await wait_line()
    started = time.perf_counter()
    window = job["window"]
    new = [Watcher(m["url"], expect=m["expect"]) for m in members]

    async def again(index: int) -> None:
        await asyncio.sleep(max(0.0, started + index * window / len(members) - time.perf_counter()))
        await old[index].close()
        await new[index].start()

    failures = [r for r in await asyncio.gather(*(again(i) for i in range(len(members))), return_exceptions=True) if r]
    reconnected = time.perf_counter() - started
    deadline = started + job.get("timeout", 300)
    while time.perf_counter() < deadline and not all(w.full_at for w in new):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    converged = [w.full_at - started for w in new if w.full_at]
    emit("converged")
    await asyncio.gather(*(w.close() for w in new), return_exceptions=True)
    emit(
        "result",
        converge_s=round(max(converged), 3) if converged else 0.0,
        not_converged=len(new) - len(converged),
        failures=len(failures),
        reconnect_s=round(reconnected, 3),
        snapshot_bytes=max(w.snapshot_bytes for w in new),
    )


SCENARIOS = {
    "idle": idle,
    "notify": notify,
    "churn": churn,
    "ceiling": ceiling,
    "burst": burst,
    "slow_reader": slow_reader,
    "flicker": flicker,
    "dead_instance": dead_instance,
    "bigroom": bigroom,
}


def scenario(name: str) -> Callable[[dict], Awaitable[None]]:
    """A scenario of this module by name, or a phase module's own as `module:function`."""
    if ":" in name:
        module, function = name.split(":")
        return getattr(importlib.import_module(module), function)
    return SCENARIOS[name]


def main() -> None:
    _raise_fd_limit()
    job = json.loads(sys.stdin.readline())
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    random.seed(job.get("seed", 1))
    try:
        asyncio.run(scenario(job["scenario"])(job))
    except Exception as error:
        # The orchestrator reads this instead of a bare "loadgen ended", and names the server.
        emit("failed", error=f"{type(error).__name__}: {error}")
        raise


if __name__ == "__main__":
    main()
