"""Rooms by size: arrivals into a mid-sized channel (`midroom`), a connect wave into a huge one (`hugeroom`).

Run by bench/run.py (`--only midroom hugeroom`).

`midroom`: 100 arrivals a second into a 320-member channel watched by 20 (on the other
instance), each subject holding its socket half a second. Keys: `midroom.notify_p99_ms` (the
watcher hears `online` after the subject's connect began) and `midroom.redis_cmds_per_connect`:
every command Redis ran in the window (INFO commandstats counts those a Lua script runs too)
over the connects made in it.

`hugeroom`: one channel of 10,000 members, large (above `large_room_members`), watched by 20
connected members on one instance while 2,000 other members connect within 10 s across two
instances; then the same wave of 2,000 users in rooms of 5. Keys: instance CPU and Redis
commands per connect against the rooms of 5 (`hugeroom.connect_cpu_vs_small`,
`hugeroom.redis_cmds_per_connect_vs_small`), `hugeroom.occupancy_lag_p99_ms` (from the wave's
last acknowledged connect, after which the count no longer changes, to each watcher's first
`presence.occupancy` showing the final count) and `hugeroom.snapshot_bytes` (a member's snapshot).
"""

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import websockets

from bench.harness import LoadGen, World, daphne, open_and_close, redis_calls, run_job, say, thread_cpu_seconds

# The targets these phases are judged by (bench/run.py's TARGETS).
TARGETS = {
    "midroom.notify_p99_ms": ("<=", 100),
    "hugeroom.connect_cpu_vs_small": ("<=", 1.5),
    "hugeroom.redis_cmds_per_connect_vs_small": ("<=", 1.5),
    "hugeroom.occupancy_lag_p99_ms": ("<=", 1500),
}
# (members, watchers, arrivals per second, seconds of arrivals) per mode.
MIDROOM = {"full": (320, 20, 100, 3.0), "quick": (320, 20, 100, 3.0), "smoke": (24, 4, 20, 1.0)}
# (members, connecting, watchers, seconds of the wave, large_room_members) per mode.
HUGEROOM = {
    "full": (10_000, 2_000, 20, 10.0, 1_000),
    "quick": (10_000, 1_000, 20, 10.0, 1_000),
    "smoke": (60, 20, 3, 1.0, 10),
}


def phase_midroom(world: World, workdir: Path, mode: str, redis_client: Any) -> dict:
    """Arrivals into one channel of `members`, `watchers` of them listening on the other instance."""
    members, watcher_count, rate, seconds = MIDROOM[mode]
    subjects = world.users("midroom-s", members - watcher_count)
    watchers = world.users("midroom-w", watcher_count)
    world.channel("midroom", watchers + subjects)
    arrivals = subjects[: int(rate * seconds)]
    warm = world.users("midroom-warmup", 1)
    world.channel("midroom-warmup", warm)
    a, b = daphne("relay-midroom-a", workdir), daphne("relay-midroom-b", workdir)
    try:
        # No measured connect is a process's first (scripts loaded, database and subscriptions open).
        open_and_close([server.ws_url(f"token={world.token(warm[0])}") for server in (a, b)])
        calls = redis_calls(redis_client)
        result = run_job(
            {
                "scenario": "notify",
                "watchers": [{"url": b.ws_url(f"token={world.token(w)}"), "subjects": arrivals} for w in watchers],
                "subjects": [{"user": s, "url": a.ws_url(f"token={world.token(s)}")} for s in arrivals],
                "rate": rate,
                "hold": 0.5,
                "settle": 1.5,
                "heartbeat": 0.0,
            }
        )
        calls = redis_calls(redis_client) - calls
    finally:
        a.stop()
        b.stop()
    connects = len(arrivals) + len(watchers)
    per_connect = round(calls / connects, 1)
    say(
        f"midroom: {members} members, {len(arrivals)} arrivals at {rate}/s, {len(watchers)} watchers: "
        f"notify p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms ({result['missing']} missing); "
        f"{per_connect} Redis commands per connect"
    )
    return {
        "midroom.notify_p99_ms": result["p99_ms"],
        "midroom.redis_cmds_per_connect": per_connect,
        "_midroom_notify_p50_ms": result["p50_ms"],
        "_midroom_missing": result["missing"],
        "_midroom_members": members,
    }


def phase_hugeroom(world: World, workdir: Path, mode: str, redis_client: Any) -> dict:
    """A connect wave into one large channel, against the same wave into rooms of 5."""
    members, connecting, watcher_count, seconds, threshold = HUGEROOM[mode]
    previous = world.environment.large_room_members
    world.environment.large_room_members = threshold
    world.environment.save(update_fields=["large_room_members"])
    try:
        users = world.users("huge", members)
        world.channel("huge", users)
        watchers, wave = users[:watcher_count], users[watcher_count : watcher_count + connecting]
        huge = _wave(world, workdir, "huge", wave, seconds, watchers, redis_client)
        say(f"hugeroom, the large channel: {huge}")
        redis_client.flushall()
        small_users = world.users("hugesmall", connecting)
        for start in range(0, connecting, 5):
            world.channel(f"hugesmall-{start}", small_users[start : start + 5])
        small = _wave(world, workdir, "hugesmall", small_users, seconds, [], redis_client)
    finally:
        world.environment.large_room_members = previous
        world.environment.save(update_fields=["large_room_members"])
    cpu_ratio = huge["cpu_ms"] / small["cpu_ms"] if small["cpu_ms"] else 0.0
    cmds_ratio = huge["cmds"] / small["cmds"] if small["cmds"] else 0.0
    say(
        f"hugeroom: {members} members, {connecting} connects in {seconds} s: {huge['cpu_ms']} ms CPU and "
        f"{huge['cmds']} Redis commands per connect (rooms of 5: {small['cpu_ms']} ms, {small['cmds']}); "
        f"occupancy lag p99 {huge['lag_p99_ms']} ms; snapshot {huge['snapshot_bytes']} bytes"
    )
    return {
        "hugeroom.connect_cpu_vs_small": round(cpu_ratio, 3),
        "hugeroom.redis_cmds_per_connect_vs_small": round(cmds_ratio, 3),
        "hugeroom.occupancy_lag_p99_ms": huge["lag_p99_ms"],
        "hugeroom.snapshot_bytes": huge["snapshot_bytes"],
        "_hugeroom_cpu_ms_per_connect": huge["cpu_ms"],
        "_hugeroom_redis_cmds_per_connect": huge["cmds"],
        "_hugesmall_cpu_ms_per_connect": small["cpu_ms"],
        "_hugesmall_redis_cmds_per_connect": small["cmds"],
        "_hugeroom_members": members,
        "_hugeroom_connects": connecting,
    }


def _wave(
    world: World, workdir: Path, name: str, wave: list[str], seconds: float, watchers: list[str], redis_client: Any
) -> dict:
    """Connect `wave` at an even pace over `seconds` (alternating two instances), `watchers` listening on the second."""
    servers = [daphne(f"relay-{name}-{index}", workdir) for index in range(2)]
    warm = world.users(f"{name}-warmup", 1)
    world.channel(f"{name}-warmup", warm)
    try:
        open_and_close([server.ws_url(f"token={world.token(warm[0])}") for server in servers])
        urls = [servers[index % 2].ws_url(f"token={world.token(uid)}") for index, uid in enumerate(wave)]
        watcher_urls = [servers[1].ws_url(f"token={world.token(uid)}") for uid in watchers]
        result = asyncio.run(_watched_wave(urls, watcher_urls, seconds, redis_client, servers))
    finally:
        for server in servers:
            server.stop()
    return result


async def _watched_wave(
    urls: list[str], watcher_urls: list[str], seconds: float, redis_client: Any, servers: list
) -> dict:
    sockets = [await websockets.connect(url, ping_interval=None, proxy=None, max_size=None) for url in watcher_urls]
    snapshot_bytes = 0
    for socket in sockets:
        while True:
            frame = await socket.recv()
            if json.loads(frame)["type"] == "presence.snapshot":
                snapshot_bytes = len(frame.encode() if isinstance(frame, str) else frame)
                break
    final = len(urls) + len(sockets)
    seen: list[float | None] = [None] * len(sockets)

    async def listen(index: int) -> None:
        async for raw in sockets[index]:
            frame = json.loads(raw)
            if frame["type"] == "presence.occupancy" and frame["payload"]["online"] >= final:
                seen[index] = time.monotonic()
                return

    listeners = [asyncio.ensure_future(listen(index)) for index in range(len(sockets))]
    cpu = sum(thread_cpu_seconds(server.pid) for server in servers)
    calls = redis_calls(redis_client)
    load = LoadGen({"scenario": "idle", "urls": urls, "concurrency": 50, "rate": len(urls) / seconds})
    await asyncio.get_running_loop().run_in_executor(None, load.expect, "ready")
    done = time.monotonic()
    cpu = sum(thread_cpu_seconds(server.pid) for server in servers) - cpu
    calls = redis_calls(redis_client) - calls
    if listeners:
        await asyncio.wait(listeners, timeout=15)
    # A frame read before the bench saw "ready" waited no time after the last change.
    lags = sorted(max(0.0, 1000 * (at - done)) for at in seen if at is not None)
    load.release()
    await asyncio.get_running_loop().run_in_executor(None, load.finish)
    for socket in sockets:
        await socket.close()
    missing = len(sockets) - len(lags)
    return {
        "cpu_ms": round(1000 * cpu / len(urls), 3),
        "cmds": round(calls / len(urls), 1),
        # A watcher that never saw the final count counts as the longest wait (15 s).
        "lag_p99_ms": round(_p99(lags + [15_000.0] * missing), 1) if sockets else 0.0,
        "snapshot_bytes": snapshot_bytes,
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
