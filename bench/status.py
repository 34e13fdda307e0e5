"""`make bench` phase `status`: rich presence's `presence.status` fan-out and its memory.

Subjects on instance A change their status (`presence.set`, a new text each time) at a steady
total rate; each subject shares one channel with `watchers` watchers on instance B, who time
the `presence.status` that carries the new text. The subjects' changes are spread so none passes
the per-connection rate (10 in 10 s). Then one instance holds idle connections of users who all
have a status set, for the memory per connection (docs/performance.md).

The clients run in this process on one event loop: the latencies include its own scheduling,
which only makes them larger.
"""

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import websockets

from bench.harness import World, daphne, open_and_close, rss_kb, say


@dataclass(frozen=True)
class StatusSizes:
    rate: float  # status changes a second, all subjects together
    seconds: float
    watchers: int  # per subject (one channel of them)
    subjects_per_channel: int
    idle_connections: int  # for the memory per connection


STATUS_SIZES = {
    "full": StatusSizes(100.0, 10.0, 20, 10, 2000),
    "quick": StatusSizes(100.0, 3.0, 20, 10, 500),
    "smoke": StatusSizes(20.0, 1.0, 3, 5, 40),
}
# Each subject changes once every this many seconds: under the 10-in-10-s rate.
SUBJECT_PERIOD_S = 2.0


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 2) if ordered else 0.0


async def _drive(
    a_url: str, b_url: str, world: World, subjects: list[str], watchers: dict[str, list[str]], sizes: StatusSizes
) -> dict:
    """Connect everyone, send the changes on schedule, and time each watcher's frame."""
    sent: dict[tuple[str, str], float] = {}
    latencies: list[float] = []
    frames = 0
    everything = asyncio.Event()
    expected = int(sizes.rate * sizes.seconds) * sizes.watchers

    async def opened(url: str, user: str) -> websockets.ClientConnection:
        socket = await websockets.connect(f"{url}token={world.token(user)}", max_size=2**22)
        while json.loads(await socket.recv())["type"] != "presence.snapshot":
            pass
        return socket

    async def watch(socket: websockets.ClientConnection, wanted: set[str]) -> None:
        nonlocal frames
        async for raw in socket:
            if '"presence.status"' not in raw:
                continue  # not worth decoding: the driver shares the machine with the servers
            frame = json.loads(raw)
            if frame["type"] != "presence.status" or frame["payload"]["user"] not in wanted:
                continue
            frames += 1
            started = sent.get((frame["payload"]["user"], frame["payload"]["text"]))
            if started is not None:
                latencies.append((time.perf_counter() - started) * 1000)
                if len(latencies) >= expected:
                    everything.set()

    watcher_sockets = []
    for watcher, wanted in watchers.items():
        watcher_sockets.append((await opened(b_url, watcher), set(wanted)))
    subject_sockets = {subject: await opened(a_url, subject) for subject in subjects}
    readers = [asyncio.ensure_future(watch(socket, wanted)) for socket, wanted in watcher_sockets]
    readers += [asyncio.ensure_future(_drain(socket)) for socket in subject_sockets.values()]
    await asyncio.sleep(0.5)
    changes = int(sizes.rate * sizes.seconds)
    interval = 1 / sizes.rate
    start = time.perf_counter()
    for index in range(changes):
        subject = subjects[index % len(subjects)]
        text = f"c{index}"
        delay = start + index * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[(subject, text)] = time.perf_counter()
        await subject_sockets[subject].send(json.dumps({"type": "presence.set", "payload": {"text": text}}))
    achieved = changes / max(time.perf_counter() - start, 1e-9)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(everything.wait(), 5.0)
    await asyncio.sleep(0.5)  # any duplicate arrives now
    for reader in readers:
        reader.cancel()
    for socket in [socket for socket, _ in watcher_sockets] + list(subject_sockets.values()):
        await socket.close()
    return {
        "latencies": latencies,
        "frames": frames,
        "changes": changes,
        "expected": expected,
        "achieved_rate": round(achieved, 1),
    }


async def _drain(socket: websockets.ClientConnection) -> None:
    async for _ in socket:
        pass


def _memory(world: World, workdir: Path, sizes: StatusSizes) -> float:
    """KB of RSS per idle connection on one instance, every user with a status set."""
    from presence.models import UserStatus
    from relay.models import User

    users = world.users("status-idle", sizes.idle_connections)
    for start in range(0, len(users), 50):
        world.channel(f"status-idle-{start // 50}", users[start : start + 50])
    rows = User.objects.filter(environment=world.environment, external_id__in=users)
    UserStatus.objects.bulk_create(
        [UserStatus(user=user, status="busy", text="in a meeting about the quarterly numbers") for user in rows],
        batch_size=2000,
    )
    server = daphne("relay-status-idle", workdir)
    try:
        open_and_close([server.ws_url(f"token={world.token(users[0])}")])
        time.sleep(1)
        before = rss_kb(server.pid)

        async def hold() -> None:
            sockets, readers = [], []
            for user in users:
                socket = await websockets.connect(server.ws_url(f"token={world.token(user)}&device=mobile"))
                sockets.append(socket)
                readers.append(asyncio.ensure_future(_drain(socket)))
            await asyncio.sleep(2)
            nonlocal after
            after = rss_kb(server.pid)
            for socket in sockets:
                await socket.close()
            for reader in readers:
                reader.cancel()

        after = before
        asyncio.run(hold())
    finally:
        server.stop()
    return round((after - before) / len(users), 2)


def phase_status(world: World, workdir: Path, mode: str) -> dict:
    """Status changes at a steady rate, timed at the watchers; memory per idle connection with statuses."""
    sizes = STATUS_SIZES[mode]
    subject_count = max(1, int(sizes.rate * SUBJECT_PERIOD_S))
    subjects = world.users("status-s", subject_count)
    watchers: dict[str, list[str]] = {}
    for index in range(0, subject_count, sizes.subjects_per_channel):
        members = subjects[index : index + sizes.subjects_per_channel]
        room = world.users(f"status-w{index}", sizes.watchers)
        world.channel(f"status-{index}", room + members)
        watchers.update(dict.fromkeys(room, members))
    a, b = daphne("relay-status-a", workdir), daphne("relay-status-b", workdir)
    try:
        say(f"status: {len(watchers)} watchers on B, {subject_count} subjects on A, {sizes.rate} changes/s")
        result = asyncio.run(_drive(a.ws_url(""), b.ws_url(""), world, subjects, watchers, sizes))
    finally:
        a.stop()
        b.stop()
    latencies = result["latencies"]
    per_change = result["frames"] / (result["changes"] * sizes.watchers) if result["changes"] else 0.0
    say(
        f"status: p50 {_percentile(latencies, 0.5)} ms, p99 {_percentile(latencies, 0.99)} ms, "
        f"{per_change:.3f} frames per watcher per change ({result['expected'] - len(latencies)} missing)"
    )
    memory = _memory(world, workdir, sizes)
    say(f"status: {memory} KB per idle connection with a status set for every user")
    return {
        "status.notify_p50_ms": _percentile(latencies, 0.5),
        "status.notify_p99_ms": _percentile(latencies, 0.99),
        "status.frames_per_watcher_per_change": round(per_change, 3),
        "status.rate": sizes.rate,
        "status.idle_kb_per_connection": memory,
        "_status_missing": result["expected"] - len(latencies),
        "_status_achieved_rate": result["achieved_rate"],
    }
