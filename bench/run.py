"""`make bench` / `make bench-quick`: start Redis and Daphne, drive real clients, write results.

Everything runs on this machine: one embedded Redis, Daphne processes for Relay and
for the bare baseline, the ceiling server, and a separate load-generator process
(bench/loadgen.py). Results go to bench/results/latest.json (the keys
docs/performance.md defines, each a number) and bench/results/latest.md (readable, with the machine,
versions and settings: bench/report.py).

The phases are the table `PHASES`, run in its order. A phase that fails is reported with the
servers its error names and the end of their logs; the others still run, the work directory
with every server's log is kept, and the run exits 1.
"""

import argparse
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import cluster, compare, fairness, rooms, status
from bench.harness import (
    BASE_DIR,
    CHURN_TIMINGS,
    MODES,
    PEER_HEARTBEAT_S,
    PEER_MAX_AGE_S,
    PEER_PRUNE_S,
    Bench,
    CommandLog,
    LoadGen,
    Peer,
    Phase,
    Server,
    Sizes,
    World,
    ceiling_server,
    cpu_seconds,
    daphne,
    open_and_close,
    peak_rss_kb,
    peer_users,
    redis_calls,
    redis_cpu_seconds,
    rss_kb,
    run_job,
    say,
    thread_cpu_seconds,
)
from bench.report import RESULTS, TARGETS, machine, versions, write_results
from bench.webhooks import phase_webhooks

P99_LIMIT_MS = 250.0
# Turns each server takes in a connect CPU round (A B B A ...).
CONNECT_CPU_TURNS = 4
PEER_CONNECT_CPU_CONNECTIONS = 200


# ── the phases ───────────────────────────────────────────────────────────────
def phase_idle(world: World, workdir: Path, sizes: Sizes) -> dict:
    """One Daphne process holding N idle, acknowledged connections: RSS and CPU."""
    users = world.users("idle", sizes.idle_connections)
    for start in range(0, len(users), 50):
        world.channel(f"idle-room-{start // 50}", users[start : start + 50])
    server = daphne("relay-idle", workdir)
    try:
        open_and_close([server.ws_url(f"token={world.token(users[0])}")])
        time.sleep(1)
        rss_before = rss_kb(server.pid)
        say(f"idle: opening {len(users)} connections to one instance")
        urls = [server.ws_url(f"token={world.token(uid)}") for uid in users]
        load = LoadGen({"scenario": "idle", "urls": urls, "concurrency": 100})
        ready = load.expect("ready")
        time.sleep(2)
        rss_after = rss_kb(server.pid)
        cpu_before = cpu_seconds(server.pid)
        time.sleep(sizes.cpu_idle_seconds)
        cpu_used = cpu_seconds(server.pid) - cpu_before
        load.release()
        load.finish()
    finally:
        server.stop()
    held = ready["connections"]
    cpu_pct = 100 * cpu_used / sizes.cpu_idle_seconds
    say(f"idle: {held} held, {(rss_after - rss_before) / held:.1f} KB each, {cpu_pct:.2f}% CPU")
    return {
        "idle.connections": held,
        "idle.rss_kb_per_connection": round((rss_after - rss_before) / held, 2),
        "idle.cpu_pct_per_1k": round(cpu_pct / (held / 1000), 3),
        "_idle_open_seconds": ready["seconds"],
        "_idle_rss_before_kb": rss_before,
        "_idle_rss_after_kb": rss_after,
    }


def _watch_world(
    world: World, prefix: str, subjects: int, watchers: int, per_channel: int
) -> tuple[list, list, dict[str, str]]:
    """Channels of `watchers` watchers plus `per_channel` subjects each.

    Returns the watcher specs, the subject ids and the channel id of every user.
    """
    subject_ids = world.users(f"{prefix}-s", subjects)
    channels = max(1, subjects // per_channel)
    watcher_specs, channel_of = [], {}
    for index in range(channels):
        members = subject_ids[index::channels]
        watcher_ids = world.users(f"{prefix}-w{index}", watchers)
        channel = world.channel(f"{prefix}-{index}", watcher_ids + members)
        channel_of.update(dict.fromkeys(watcher_ids + members, channel))
        watcher_specs += [{"user": uid, "subjects": members} for uid in watcher_ids]
    return watcher_specs, subject_ids, channel_of


def warm_up(world: World, prefix: str, *servers: Server) -> None:
    """One connect and close on each instance, so no measured connect is a process's first.

    A process's first connect loads the Lua scripts, opens its database connection and makes its
    first subscriptions (tens of ms): at 300 subjects x 20 watchers, one such subject is a third of
    the samples above p99.
    """
    user = world.users(f"{prefix}-warmup", 1)[0]
    world.channel(f"{prefix}-warmup", [user])
    for server in servers:
        open_and_close([server.ws_url(f"token={world.token(user)}")])


def phase_notify(world: World, workdir: Path, sizes: Sizes, kind: str = "relay") -> dict:
    """Subject connects on A → watcher on B hears `online`, at a steady rate (Relay, or the peer: `peer.notify.*`)."""
    count = int(sizes.notify_rate * sizes.notify_seconds)
    watchers, subjects, channel_of = _watch_world(world, f"{kind}-notify", count, sizes.notify_watchers, per_channel=20)
    peer = None
    if kind == "peer":
        peer_users(watchers_and(watchers, subjects))
        peer = Peer("peer-notify", workdir)
        a, b = peer.servers

        def url(server: Server, user: str) -> str:
            return server.ws_url(f"user={user}&channels={channel_of[user]}")
    else:
        a, b = daphne("relay-notify-a", workdir), daphne("relay-notify-b", workdir)

        def url(server: Server, user: str) -> str:
            return server.ws_url(f"token={world.token(user)}")

    try:
        if kind == "relay":
            warm_up(world, "notify", a, b)
        say(f"notify ({kind}): {len(watchers)} watchers on B, {count} subjects on A at {sizes.notify_rate}/s")
        result = run_job(
            {
                "scenario": "notify",
                "watchers": [{"url": url(b, w["user"]), "subjects": w["subjects"]} for w in watchers],
                "subjects": [{"user": s, "url": url(a, s)} for s in subjects],
                "rate": sizes.notify_rate,
                "hold": 0.5,
                "settle": 1.5,
                "heartbeat": PEER_HEARTBEAT_S if kind == "peer" else 0.0,
            }
        )
    finally:
        if peer:
            peer.stop()
        else:
            a.stop()
            b.stop()
    say(
        f"notify ({kind}): p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms "
        f"({result['samples']} samples, {result['missing']} missing)"
    )
    if kind == "peer":
        return {
            "peer.notify.p50_ms": result["p50_ms"],
            "peer.notify.p99_ms": result["p99_ms"],
            "_peer_notify_missing": result["missing"],
            "_peer_notify_achieved_rate": result["achieved_rate"],
        }
    return {
        "notify.p50_ms": result["p50_ms"],
        "notify.p99_ms": result["p99_ms"],
        "notify.rate": sizes.notify_rate,
        "notify.watchers": sizes.notify_watchers,
        "_notify_missing": result["missing"],
        "_notify_achieved_rate": result["achieved_rate"],
    }


def _churn_job(world: World, a: Server, b: Server, prefix: str, rate: int, seconds: float, kind: str) -> dict:
    count = int(rate * seconds)
    watchers, subjects, channel_of = _watch_world(world, prefix, count, 20, per_channel=max(1, count // 20))
    if kind == "peer":
        peer_users(watchers_and(watchers, subjects))

    def url(server: Server, user: str, announce: bool) -> str:
        if kind == "relay":
            return server.ws_url(f"token={world.token(user)}")
        if kind == "peer":
            return server.ws_url(f"user={user}&channels={channel_of[user]}")
        # Bare watchers only listen: Relay's watchers announce themselves once, before the window.
        return server.ws_url(f"channels={channel_of[user]}" + (f"&user={user}" if announce else ""))

    return {
        "scenario": "churn",
        # Half of each channel's watchers on each instance; subjects alternate instances.
        "watchers": [
            {"url": url((a, b)[i % 2], w["user"], False), "subjects": w["subjects"]} for i, w in enumerate(watchers)
        ],
        "subjects": [{"user": s, "url": url((a, b)[i % 2], s, True)} for i, s in enumerate(subjects)],
        "rate": rate,
        "hold": 0.05,
        "settle": 1.5,
        "heartbeat": PEER_HEARTBEAT_S if kind == "peer" else 0.0,
    }


def watchers_and(watchers: list[dict], subjects: list[str]) -> list[str]:
    return [w["user"] for w in watchers] + subjects


def phase_churn(
    world: World,
    workdir: Path,
    sizes: Sizes,
    redis_nodes: Sequence[Any],
    kind: str = "relay",
    label: str = "",
    env: Mapping[str, str] | None = None,
) -> tuple[dict, list[dict]]:
    """Raise the connect/disconnect rate until online p99 passes 250 ms or the rate cannot be held.

    `kind`: `bare`, the same climb against the bare fan-out consumer (bench/bare.py) on the same
    servers, the stack's own ceiling for the same load (`_bare_transitions_max_per_s`,
    `_bare_fanout_frames_per_s`); `peer`, against the Django peer (bench/peers/), from its own
    rates (`peer.transitions.max_per_s`, `peer.frames_per_transition`).
    `redis_nodes`: a client of each Redis the servers use (each master of a cluster), whose CPU
    each step records; `label` names the climb's servers, users and steps (`kind` by default);
    `env`, more settings for Relay's servers (the cluster phase's RELAY_REDIS_CLUSTER_NODES).
    """
    label = label or kind
    name = f"{label}-churn"
    peer = None
    if kind == "peer":
        peer = Peer(name, workdir)
        a, b = peer.servers
    else:
        app = {"app": "bench.bare:application"} if kind == "bare" else {}
        a = daphne(f"{name}-a", workdir, **app, **CHURN_TIMINGS, **(env or {}))
        b = daphne(f"{name}-b", workdir, **app, **CHURN_TIMINGS, **(env or {}))
    steps, best = [], None
    try:
        if kind == "relay":
            warm_up(world, name, a, b)
        for rate in sizes.peer_churn_rates if kind == "peer" else sizes.churn_rates:
            job = _churn_job(world, a, b, f"{name}{rate}", rate, sizes.churn_seconds, kind)
            load = LoadGen(job)
            load.expect("started")
            servers_before = cpu_seconds(a.pid) + cpu_seconds(b.pid)
            redis_before = [redis_cpu_seconds(node) for node in redis_nodes]
            load.expect("ended")
            servers = cpu_seconds(a.pid) + cpu_seconds(b.pid) - servers_before
            redis_used = [
                redis_cpu_seconds(node) - before for node, before in zip(redis_nodes, redis_before, strict=True)
            ]
            result = load.finish()
            window = result["seconds"]
            # Cores busy during the window, in % of one core: the two instances, the load generator, Redis.
            result.update(
                server=label,
                cpu_pct_servers=round(100 * servers / window),
                cpu_pct_loadgen=round(100 * result["cpu_seconds"] / window),
                cpu_pct_redis=round(100 * sum(redis_used) / window),
                redis_cpu_seconds_by_node=redis_used,
            )
            steps.append(result)
            held = result["achieved_rate"] >= 0.9 * rate and result["missing_online"] == 0
            say(
                f"{name} {rate}/s: achieved {result['achieved_rate']}/s, p99 {result['p99_ms']} ms, "
                f"{result['frames_per_s']} frames/s, missing {result['missing_online']}/{result['missing_offline']}; "
                f"CPU servers {result['cpu_pct_servers']}%, load generator {result['cpu_pct_loadgen']}%, "
                f"Redis {result['cpu_pct_redis']}%"
            )
            if result["p99_ms"] > P99_LIMIT_MS or not held:
                break
            best = result
    finally:
        if peer:
            peer.stop()
        else:
            a.stop()
            b.stop()
    first = steps[0]
    # Presence frames per watcher per transition it should hear (each pair: `online` and `offline`).
    per_transition = round(first["frames"] / first["watcher_transitions"], 3) if first["watcher_transitions"] else 0.0
    if kind == "peer":
        return {
            "peer.transitions.max_per_s": best["rate"] if best else 0,
            "peer.frames_per_transition": per_transition,
            "peer.bytes_per_frame": first["bytes_per_frame"],
            "_peer_fanout_frames_per_s": best["frames_per_s"] if best else 0.0,
        }, steps
    if kind == "bare":
        return {
            "_bare_transitions_max_per_s": best["rate"] if best else 0,
            "_bare_fanout_frames_per_s": best["frames_per_s"] if best else 0.0,
        }, steps
    return {
        "transitions.max_per_s": best["rate"] if best else 0,
        "fanout.frames_per_s": best["frames_per_s"] if best else 0.0,
        "frames_per_transition": per_transition,
        "bytes_per_frame": first["bytes_per_frame"],
    }, steps


def phase_commands(world: World, workdir: Path, redis_client: Any) -> dict:
    """Commands one user in 5 channels costs Redis to connect, then to disconnect (grace check included).

    The key counts the commands the instance SENDS (MONITOR, script internals excluded: the unit of
    "2 + channels" and of round trips); INFO commandstats deltas, which add every command a Lua script
    calls, are kept as supporting numbers. No background work can fall in a window: Redis is flushed
    before the phase (an earlier phase's leftover deadlines made the reaper run ~1,500 commands in
    the old disconnect window) and the refresh interval is longer than the phase.
    """
    members = world.users("cmd", 3)
    subject, neighbour, warmup = members
    for index in range(5):
        world.channel(f"cmd-{index}", members)
    timings = {**CHURN_TIMINGS, "RELAY_PRESENCE_TTL_MS": "120000", "RELAY_PRESENCE_REFRESH_MS": "60000"}
    server = daphne("relay-commands", workdir, **timings)
    log = CommandLog(_url_of(redis_client))
    settle = 0.4  # past grace (300 ms) + margin (50 ms): the grace check and the `offline` count
    try:
        # A neighbour already connected on the instance: the steady state, where the channels'
        # groups are already subscribed and only the subject's own work counts. One warm-up
        # cycle first, so the scripts are loaded and the process's one-off subscriptions done.
        hold = LoadGen({"scenario": "idle", "urls": [server.ws_url(f"token={world.token(neighbour)}")]})
        hold.expect("ready")
        open_and_close([server.ws_url(f"token={world.token(warmup)}")])
        time.sleep(settle + 0.3)
        executed = redis_calls(redis_client)
        started = time.monotonic()
        subject_load = LoadGen({"scenario": "idle", "urls": [server.ws_url(f"token={world.token(subject)}")]})
        subject_load.expect("ready")
        time.sleep(0.3)
        connected = time.monotonic()
        executed_connect = redis_calls(redis_client) - executed - 1  # the INFO itself
        executed = redis_calls(redis_client)
        subject_load.release()
        subject_load.finish()
        time.sleep(settle + 0.3)
        ended = time.monotonic()
        executed_disconnect = redis_calls(redis_client) - executed - 1
        hold.release()
        hold.finish()
    finally:
        server.stop()
        log.close()
    time.sleep(0.2)
    sent_connect, lua_connect = log.between(started, connected)
    sent_disconnect, lua_disconnect = log.between(connected, ended)
    # The harness's own INFO calls are not the instance's.
    sent_connect = [c for c in sent_connect if not c.upper().startswith("INFO")]
    sent_disconnect = [c for c in sent_disconnect if not c.upper().startswith("INFO")]
    say(
        f"redis: {len(sent_connect)} commands sent per connect ({len(lua_connect)} more inside scripts), "
        f"{len(sent_disconnect)} per disconnect ({len(lua_disconnect)} inside scripts), 5 channels"
    )
    return {
        "redis.commands_per_connect": len(sent_connect),
        "redis.commands_per_disconnect": len(sent_disconnect),
        "_redis_connect_commands": " ".join(c.split()[0] for c in sent_connect),
        "_redis_disconnect_commands": " ".join(c.split()[0] for c in sent_disconnect),
        "_redis_executed_per_connect": executed_connect,
        "_redis_executed_per_disconnect": executed_disconnect,
    }


def _url_of(client: Any) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def _connect_cpu_slice(server: Server, urls: list[str]) -> tuple[float, float]:
    """CPU seconds of one server for these connects, and for their closes."""
    before = thread_cpu_seconds(server.pid)
    load = LoadGen({"scenario": "idle", "urls": urls, "concurrency": 50})
    load.expect("ready")
    connected = thread_cpu_seconds(server.pid)
    load.release()
    load.finish()
    time.sleep(0.5)  # the server finishes its closes after the clients have gone
    return connected - before, thread_cpu_seconds(server.pid) - connected


def _interleaved_connect_cpu(servers: Sequence[tuple[Server, list[str]]], turns: int) -> list[tuple[float, float]]:
    """Each server's CPU per connect and per close, its connects made in `turns` turns, alternating.

    The machine's speed drifts over seconds (a neighbour on the other vCPU): measured one after
    the other, Relay's connects and the bare consumer's saw different machines, and one round's
    ratio read anywhere from 1.06 to 1.69. Taking turns in an A B B A order gives both the same
    drift. One connection first on each: a process's one-off costs (lazy imports, the first
    subscription, script loading) are not a connect's.
    """
    for _, urls in servers:
        open_and_close(urls[:1])
    spent = [[0.0, 0.0, 0] for _ in servers]
    for turn in range(turns):
        order = range(len(servers)) if turn % 2 == 0 else reversed(range(len(servers)))
        for index in order:
            server, urls = servers[index]
            part = urls[1:][turn::turns]
            connect, close = _connect_cpu_slice(server, part)
            spent[index][0] += connect
            spent[index][1] += close
            spent[index][2] += len(part)
    return [(connect / count, close / count) for connect, close, count in spent]


def spread(values: Sequence[float]) -> str:
    """A ratio's range over the rounds it is the median of."""
    return f"{min(values):.2f}-{max(values):.2f} over {len(values)} rounds"


def phase_connect_cpu(world: World, workdir: Path, sizes: Sizes, with_peer: bool) -> dict:
    """Relay's CPU per connect against the bare consumer's and the peer's, same users and groups.

    Each user has a channel of their own: the connect path alone is measured, as the bare
    consumer does no fan-out. (With 50 users per channel, each connect would also deliver up to
    49 co-members' `online` frames: fan-out, which `fanout.frames_per_s` measures.)
    A round measures all on fresh servers with users new to them (first connects), taking turns
    (`_interleaved_connect_cpu`); each ratio is the rounds' median, its spread beside it.
    """
    rounds = []
    for round_number in range(sizes.connect_cpu_rounds):
        users = world.users(f"cpu{round_number}", sizes.connect_cpu_connections)
        channel_of = {uid: world.channel(f"cpu-room-{uid}", [uid]) for uid in users}
        relay = daphne(f"relay-cpu-{round_number}", workdir)
        bare = daphne(f"bare-cpu-{round_number}", workdir, app="bench.bare:application")
        measured = [
            (relay, [relay.ws_url(f"token={world.token(uid)}") for uid in users]),
            (bare, [bare.ws_url(f"channels={channel_of[uid]}") for uid in users]),
        ]
        peer = None
        if with_peer:
            # Fewer for the peer: its synchronous connects on SQLite would outlast the load
            # generator's wait for their acks; CPU is per connect either way.
            peer_cpu_users = users[: PEER_CONNECT_CPU_CONNECTIONS + 1]
            peer_users(peer_cpu_users)
            peer = Peer(f"peer-cpu-{round_number}", workdir, count=1)
            server = peer.servers[0]
            measured.append(
                (server, [server.ws_url(f"user={uid}&channels={channel_of[uid]}") for uid in peer_cpu_users])
            )
        try:
            spent = _interleaved_connect_cpu(measured, CONNECT_CPU_TURNS)
        finally:
            relay.stop()
            bare.stop()
            if peer:
                peer.stop()
        (relay_cpu, relay_close), (bare_cpu, bare_close) = spent[:2]
        peer_cpu, peer_close = spent[2] if peer else (0.0, 0.0)
        # Without schedstat (ticks), the bare server's CPU can round to none at smoke size.
        ratio = relay_cpu / bare_cpu if bare_cpu else 0.0
        rounds.append((ratio, relay_cpu, bare_cpu, relay_close, bare_close, peer_cpu, peer_close))
        say(
            f"connect CPU, round {round_number + 1}: relay {relay_cpu * 1000:.2f} ms, bare {bare_cpu * 1000:.2f} ms "
            f"(ratio {ratio:.2f}), peer {peer_cpu * 1000:.2f} ms; close: relay {relay_close * 1000:.2f} ms, "
            f"bare {bare_close * 1000:.2f} ms, peer {peer_close * 1000:.2f} ms"
        )
    ratio, relay_cpu, bare_cpu, relay_close, bare_close, *_ = sorted(rounds)[len(rounds) // 2]
    results = {
        "ratio.connect_cpu_vs_bare": round(ratio, 3),
        "_spread:ratio.connect_cpu_vs_bare": spread([r[0] for r in rounds]),
        # The median round's numbers, then every round's ratio.
        "connect_cpu_ms": round(relay_cpu * 1000, 3),
        "_connect_cpu_ms_bare": round(bare_cpu * 1000, 3),
        "_connect_cpu_round_ratios": " ".join(f"{round_ratio:.3f}" for round_ratio, *_ in rounds),
        # Without the grace check, which fires RELAY_PRESENCE_GRACE_MS later (30 s by default).
        "_close_cpu_ms_relay": round(relay_close * 1000, 3),
        "_close_cpu_ms_bare": round(bare_close * 1000, 3),
    }
    if with_peer:
        peer_ratios = sorted((r[1] / r[5] if r[5] else 0.0, r[5], r[6]) for r in rounds)
        peer_ratio, peer_cpu, peer_close = peer_ratios[len(rounds) // 2]
        results.update(
            {
                "peer.connect_cpu_ms": round(peer_cpu * 1000, 3),
                "ratio.connect_cpu_vs_peer": round(peer_ratio, 3),
                "_spread:ratio.connect_cpu_vs_peer": spread([r[0] for r in peer_ratios]),
                "_close_cpu_ms_peer": round(peer_close * 1000, 3),
            }
        )
    return results


def _callgrind_server(workdir: Path, name: str, app: str) -> tuple[Server, Path]:
    """A server under callgrind, and where its counts will be written."""
    out = workdir / f"callgrind-{name}"
    server = daphne(
        f"{name}-instructions",
        workdir,
        app=app,
        under=f"valgrind --tool=callgrind --callgrind-out-file={out}.%p",
        ready_seconds=600,
        # Fifty connects at once run some fifty times slower under callgrind: the last of them
        # would pass Daphne's 5 s handshake timeout and be closed unanswered.
        options="--websocket_connect_timeout 300",
    )
    return server, out


def _count_connects(server: Server, urls: list[str]) -> None:
    """Zero the server's counts, make the first connects of `urls[1:]`, and have the counts written."""
    # Counting starts at zero after the process's one-off costs (callgrind_control -z) and is
    # written out once the connects are acknowledged (-d), as the connect CPU phase measures them.
    open_and_close(urls[:1])
    subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
    load = LoadGen({"scenario": "idle", "urls": urls[1:], "concurrency": 50})
    load.expect("ready")
    subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
    load.release()
    load.finish()


def _counted(server: Server, out: Path) -> int | None:
    """The instructions (every thread, user space) the server's counts were written with."""
    for line in Path(f"{out}.{server.pid}.1").read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    return None


def phase_connect_instructions(world: World, workdir: Path, sizes: Sizes) -> dict:
    """Relay's instructions per connect against the bare consumer's, counted by callgrind.

    CPU seconds on a shared machine vary by ±12 % from one round to the next (the connect ratio is
    a median of rounds for that reason); the instructions a connect executes do not, to ±2 %.
    They leave out what the kernel does (accept, reads, writes, the same for both servers) and
    what the machine does to the process (caches, a busy neighbour core), so this ratio is a
    supporting number beside `ratio.connect_cpu_vs_bare`, and the one to compare changes by.
    Skipped where valgrind is not installed.
    """
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        say("connect instructions: skipped, valgrind is not installed")
        return {"_connect_instructions": "skipped: valgrind is not installed"}
    count = sizes.instruction_connections
    apps = {"relay": "relay.asgi:application", "bare": "bench.bare:application"}
    users = {name: world.users(f"instructions-{name}", count + 1) for name in apps}
    # A channel of their own each, as in the connect CPU phase.
    channel_of = {uid: world.channel(f"instructions-room-{uid}", [uid]) for name in apps for uid in users[name]}
    # Both start at once: starting Django under valgrind takes most of the phase. Their connects
    # are then counted one server at a time, the other idle.
    with ThreadPoolExecutor(2) as pool:
        starting = {name: pool.submit(_callgrind_server, workdir, name, app) for name, app in apps.items()}
    # One that failed to start must not leave the other running.
    servers = {name: future.result() for name, future in starting.items() if future.exception() is None}
    failures = [future.exception() for future in starting.values() if future.exception() is not None]
    try:
        if failures:
            raise failures[0]
        relay_server, bare_server = servers["relay"][0], servers["bare"][0]
        _count_connects(relay_server, [relay_server.ws_url(f"token={world.token(uid)}") for uid in users["relay"]])
        _count_connects(bare_server, [bare_server.ws_url(f"channels={channel_of[uid]}") for uid in users["bare"]])
    finally:
        for server, _ in servers.values():
            server.stop()
    relay, bare = (_counted(*servers[name]) for name in apps)
    if not relay or not bare:
        return {"_connect_instructions": "not counted: callgrind wrote no totals"}
    say(f"connect instructions: relay {relay / count / 1e6:.2f} M, bare {bare / count / 1e6:.2f} M")
    return {
        "_connect_instructions_relay_m": round(relay / count / 1e6, 3),
        "_connect_instructions_bare_m": round(bare / count / 1e6, 3),
        "_connect_instructions_ratio": round(relay / bare, 3),
    }


def phase_ceiling(workdir: Path, sizes: Sizes, watchers: int) -> dict:
    server = ceiling_server(workdir)
    try:
        result = run_job(
            {
                "scenario": "ceiling",
                "urls": [server.ws_url("") for _ in range(watchers)],
                "control_url": f"ws://127.0.0.1:{server.port}/control",
                "frames": sizes.ceiling_frames,
            }
        )
    finally:
        server.stop()
    say(f"ceiling: {result['frames_per_s']} frames/s to {watchers} watchers")
    return {"_ceiling_frames_per_s": result["frames_per_s"]}


def _inject(url: str, layer_name: str, channel_id: str, count: int) -> None:
    """Publish `count` distinct presence changes into one channel's group, as fast as it can."""
    import asyncio

    from django.utils.module_loading import import_string

    from bench.settings import channel_layers_for

    # The core layer logs each over-capacity drop; the result reports them as `missing`.
    logging.getLogger("channels_redis").setLevel(logging.WARNING)
    config = channel_layers_for(url, layer_name)["default"]
    layer = import_string(config["BACKEND"])(**config["CONFIG"])
    sends = [
        (f"presence.{channel_id}", {"type": "bare.changed", "user": f"burst-{i}", "state": "online"})
        for i in range(count)
    ]

    async def run() -> None:
        # Batches of 100 in flight: the core layer's group_send is one script call per message, and
        # one at a time would measure the injector rather than the instance.
        for start in range(0, count, 100):
            batch = sends[start : start + 100]
            await asyncio.gather(*(layer.group_send(group, message) for group, message in batch))

    asyncio.run(run())


def phase_layers(world: World, workdir: Path, sizes: Sizes, redis_url: str, watchers: int) -> dict:
    """The same burst of presence changes into one channel of `watchers`, on each channel layer.

    The bare fan-out consumer (bench/bare.py) on Relay's layer and on channels-redis's core layer:
    the layers' own fan-out capacity, without Relay's process-wide claim and without connects in
    the way (the churn phases saturate on connects first).
    """
    rates, missing = {}, {}
    for layer in ("relay", "core"):
        channel = world.channel(f"burst-{layer}", [])
        server = daphne(
            f"bare-{layer}",
            workdir,
            app="bench.bare:application",
            DJANGO_SETTINGS_MODULE="bench.settings",
            BENCH_CHANNEL_LAYER=layer,
        )
        try:
            load = LoadGen(
                {
                    "scenario": "burst",
                    "urls": [server.ws_url(f"channels={channel}") for _ in range(watchers)],
                    "frames": sizes.ceiling_frames,
                }
            )
            load.expect("ready")
            load.release()
            _inject(redis_url, layer, channel, sizes.ceiling_frames)
            result = load.finish()
        finally:
            server.stop()
        rates[layer] = result["frames_per_s"]
        missing[layer] = result["missing"]
        say(
            f"layer {layer}: {result['frames_per_s']} frames/s ({result['frames']} frames to {watchers} watchers, "
            f"{result['missing']} dropped)"
        )
    return {
        "layers.pubsub_vs_core_frames": round(rates["relay"] / rates["core"], 3) if rates["core"] else 0.0,
        "_burst_pubsub_frames_per_s": rates["relay"],
        "_burst_core_frames_per_s": rates["core"],
        "_burst_pubsub_dropped": missing["relay"],
        "_burst_core_dropped": missing["core"],
    }


# The largest `text` a message may have, in four-byte characters: 64 KiB a frame.
SLOW_READER_TEXT = "\U0001f600" * 16_384
# Messages in flight to the healthy members: 512 KiB each, well inside the bound.
SLOW_READER_WINDOW = 8
SLOW_READER_WARMUP = 128


def phase_slow_reader(world: World, workdir: Path, sizes: Sizes) -> dict:
    """One member stops reading while `slow_reader_mb` MB of `message.created` go to its channel.

    The stalled member is a raw socket with a 4 KiB receive window that never reads after its
    handshake; the healthy members read everything, and the first of them sends the messages,
    each once every healthy member has the one 8 before it (a member that keeps up never has
    more than that queued). The instance's memory is measured from after a warm-up of the
    channel's fan-out to its peak (VmHWM) during the sending: what the stalled member cost it.
    """
    from relay.settings import DEFAULT_MAX_PENDING_BYTES

    healthy = world.users("slow-healthy", sizes.slow_reader_healthy)
    stalled = world.users("slow-stalled", 1)[0]
    channel = world.channel("slow-reader", [*healthy, stalled])
    bound = sizes.slow_reader_bound or DEFAULT_MAX_PENDING_BYTES
    env = {"RELAY_MAX_PENDING_BYTES": str(sizes.slow_reader_bound)} if sizes.slow_reader_bound else {}
    # One sender as fast as the window lets it: the phase measures the fan-out, not the frame rate limit.
    env["RELAY_RATE_FRAMES_PER_S"] = "1000000"
    frame_bytes = len(SLOW_READER_TEXT.encode()) + 200  # the frame's other fields, about
    messages = -(-sizes.slow_reader_mb * 1024 * 1024 // frame_bytes)
    server = daphne("relay-slow-reader", workdir, **env)
    try:
        say(f"slow reader: {len(healthy)} healthy members and one stalled, {messages} messages of 64 KiB")
        load = LoadGen(
            {
                "scenario": "slow_reader",
                "urls": [server.ws_url(f"token={world.token(uid)}") for uid in healthy],
                "stalled_url": server.ws_url(f"token={world.token(stalled)}"),
                "channel": channel,
                "text": SLOW_READER_TEXT,
                "window": SLOW_READER_WINDOW,
                "warmup": SLOW_READER_WARMUP,
                "messages": messages,
            }
        )
        load.expect("ready")
        rss_before = rss_kb(server.pid)
        load.release()
        result = load.finish()
        peak = peak_rss_kb(server.pid)
    finally:
        server.stop()
    cut_loose = [
        line
        for line in (workdir / "relay-slow-reader.log").read_text().splitlines()
        if '"connection.slow"' in line and json.loads(line).get("user") == stalled
    ]
    growth_mb = (peak - rss_before) / 1024
    ratio = result["delivered"] / result["expected"] if result["expected"] else 0.0
    say(
        f"slow reader: RSS grew {growth_mb:.1f} MB (bound {bound / 2**20:g} MiB), healthy members got "
        f"{result['delivered']}/{result['expected']} frames in {result['seconds']} s, "
        f"stalled member cut loose {len(cut_loose)} time(s)"
    )
    return {
        "slow_reader.rss_growth_mb": round(growth_mb, 1),
        "slow_reader.healthy_delivered_ratio": round(ratio, 4),
        "_slow_reader_healthy_members": len(healthy),
        "_slow_reader_sent_mb": round(messages * frame_bytes / 2**20, 1),
        "_slow_reader_bound_mb": round(bound / 2**20, 3),
        "_slow_reader_cut_loose": len(cut_loose),
        "_slow_reader_pending_bytes": json.loads(cut_loose[0])["pending_bytes"] if cut_loose else 0,
        "_slow_reader_rss_before_mb": round(rss_before / 1024, 1),
        "_slow_reader_seconds": result["seconds"],
    }


# ── the phases table ─────────────────────────────────────────────────────────
# Each runs on an empty Redis, in this order; `--only` names them. A phase in its own module is
# one entry here: `Phase("name", module.run, sizes={"full": ..., "quick": ..., "smoke": ...},
# targets={"name.key": ("<=", 2)})`.
def run_notify(bench: Bench, sizes: Sizes) -> dict:
    results = phase_notify(bench.world, bench.workdir, sizes)
    if bench.with_peer:
        bench.redis.flushall()
        results.update(phase_notify(bench.world, bench.workdir, sizes, "peer"))
    return results


def run_churn(bench: Bench, sizes: Sizes) -> dict:
    results: dict = {}
    for kind in ("relay", "bare", *(("peer",) if bench.with_peer else ())):
        bench.redis.flushall()
        churn, steps = phase_churn(bench.world, bench.workdir, sizes, [bench.redis], kind)
        results.update(churn)
        bench.steps += steps
    return results


def run_ceiling(bench: Bench, sizes: Sizes) -> dict:
    """The layers phase's burst (frames per watcher, 20 watchers) pushed by a minimal websockets server."""
    relay = bench.results.get("_burst_pubsub_frames_per_s")
    if relay is None:
        return {}
    results = phase_ceiling(bench.workdir, sizes, watchers=20)
    ceiling = results["_ceiling_frames_per_s"]
    results["ratio.frames_vs_ceiling"] = round(relay / ceiling, 3) if ceiling else 0.0
    return results


PHASES = (
    Phase("idle", lambda bench, sizes: phase_idle(bench.world, bench.workdir, sizes)),
    Phase("notify", run_notify),
    Phase("churn", run_churn),
    Phase("commands", lambda bench, sizes: phase_commands(bench.world, bench.workdir, bench.redis)),
    Phase("cpu", lambda bench, sizes: phase_connect_cpu(bench.world, bench.workdir, sizes, bench.with_peer)),
    Phase("instructions", lambda bench, sizes: phase_connect_instructions(bench.world, bench.workdir, sizes)),
    Phase("layers", lambda bench, sizes: phase_layers(bench.world, bench.workdir, sizes, bench.redis_url, watchers=20)),
    Phase("ceiling", run_ceiling),
    Phase("slow_reader", lambda bench, sizes: phase_slow_reader(bench.world, bench.workdir, sizes)),
    Phase("behaviours", lambda bench, sizes: compare.phase_behaviours(bench.world, bench.workdir, bench.with_peer)),
    Phase("reap", lambda bench, sizes: compare.phase_reap(bench.world, bench.workdir, sizes)),
    Phase("bigroom", lambda bench, sizes: compare.phase_bigroom(bench.world, bench.workdir, sizes, bench.redis)),
    Phase("paced", lambda bench, sizes: compare.phase_paced(bench.world, bench.workdir, sizes)),
    Phase(
        "webhooks",
        lambda bench, sizes: phase_webhooks(bench.world, bench.workdir, sizes),
        targets={"webhooks.events_per_s": (">=", 1000), "webhooks.presence_p99_ratio_hanging_receiver": ("<=", 1.2)},
    ),
    Phase(
        "midroom",
        lambda bench, sizes: rooms.phase_midroom(bench.world, bench.workdir, bench.mode, bench.redis),
        targets=rooms.TARGETS,
    ),
    Phase(
        "hugeroom",
        lambda bench, sizes: rooms.phase_hugeroom(bench.world, bench.workdir, bench.mode, bench.redis),
        targets=rooms.TARGETS,
    ),
    Phase("fairness", fairness.run, sizes=fairness.SIZES, targets=fairness.TARGETS),
    Phase(
        "cluster",
        lambda bench, sizes: cluster.run(bench, sizes, phase_churn),
        sizes=cluster.SIZES,
        targets=cluster.TARGETS,
    ),
    Phase(
        "status",
        lambda bench, sizes: status.phase_status(bench.world, bench.workdir, bench.mode),
        targets={
            "status.notify_p99_ms": ("<=", 100),
            "status.frames_per_watcher_per_change": ("<=", 1.0),
            "status.idle_kb_per_connection": ("<=", 40),
        },
    ),
)


def run_phase(phase: Phase, bench: Bench) -> str | None:
    """Run one phase into `bench.results`; on failure, what failed and why (the phase's keys are left out).

    A failure names every server its error mentions (by port) with its state and the end of its
    log, so a lost ack says which instance kept it; the other phases still run.
    """
    # Each phase starts on an empty Redis: an earlier phase's deadlines would otherwise keep
    # the new instances' reapers busy publishing `offline` for users long gone.
    bench.redis.flushall()
    before = set(Server.by_port.values())
    try:
        bench.results.update(phase.run(bench, phase.sizes_for(bench)))
    except Exception as error:
        why = f"{type(error).__name__}: {error}"
        servers = list(Server.by_port.values())
        named = [server for server in servers if f":{server.port}/" in why or f"port {server.port})" in why]
        # An error that names none (a server that died mid-phase): the phase's own servers.
        shown = named or [server for server in servers if server not in before and server.died]
        report = "\n\n".join([why, *(server.describe() for server in shown)])
        say(f"phase {phase.name} FAILED: {report}")
        return report
    return None


def peer_ratios(results: dict, sizes: Sizes) -> dict:
    """Relay against the peer, from keys the phases wrote (those that ran)."""
    ratios = {}
    relay, peer = results.get("transitions.max_per_s"), results.get("peer.transitions.max_per_s")
    if relay is not None and peer:
        ratios["ratio.transitions_vs_peer"] = round(relay / peer, 3)
        ratios["_spread:ratio.transitions_vs_peer"] = "one climb each"
    elif relay is not None and peer == 0:
        # The peer held none of its rates: against the lowest one tried, the ratio is a floor.
        lowest = sizes.peer_churn_rates[0]
        ratios["ratio.transitions_vs_peer"] = round(relay / lowest, 3)
        ratios["_spread:ratio.transitions_vs_peer"] = f"a floor: the peer held none of its rates ({lowest}/s lowest)"
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the same metrics at smaller sizes (about 2 minutes)")
    parser.add_argument("--smoke", action="store_true", help="every phase at toy sizes, in seconds (CI)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where latest.json and latest.md go")
    parser.add_argument(
        "--only",
        nargs="*",
        help=f"run only these phases ({' '.join(phase.name for phase in PHASES)})",
    )
    parser.add_argument("--no-peer", action="store_true", help="leave the Django peer (bench/peers/) out")
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    chosen = [phase for phase in PHASES if not args.only or phase.name in args.only]
    # The peer is installed by the `bench*` make targets only (bench/requirements.txt).
    with_peer = not args.no_peer and importlib.util.find_spec("channels_presence") is not None
    peer_note = (
        "django-channels-presence-4-0 (bench/peers/)"
        if with_peer
        else "left out: --no-peer"
        if args.no_peer
        else "left out: django-channels-presence-4-0 is not installed (pip install -r bench/requirements.txt)"
    )

    started = time.time()
    sys.path.insert(0, str(BASE_DIR))
    import redis

    from devtools.embedded_redis import EmbeddedRedis

    # Kept when a phase fails: the servers' logs are what says why.
    workdir = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    failures: dict[str, str] = {}
    with EmbeddedRedis() as redis_server:
        say(f"bench ({mode}): Redis {redis_server.url}, work dir {workdir}")
        redis_client = redis.Redis.from_url(redis_server.url)
        bench = Bench(
            mode, MODES[mode], World(workdir, redis_server.url), workdir, redis_server.url, redis_client, with_peer
        )
        redis_version = redis_client.info("server")["redis_version"]
        for phase in chosen:
            failure = run_phase(phase, bench)
            if failure:
                failures[phase.name] = failure
        if with_peer:
            bench.results.update(peer_ratios(bench.results, bench.sizes))
        redis_client.close()
    context = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "seconds": round(time.time() - started),
        "workdir": workdir,
        "machine": machine(),
        "versions": versions(redis_version),
        "settings": {
            "sizes": bench.sizes,
            "servers": "python -m relay.serve (Daphne on uvloop, GC thresholds 50000/50/100), Relay and bare alike",
            "churn timings": CHURN_TIMINGS,
            "p99 limit ms": P99_LIMIT_MS,
            "peer": peer_note,
            "peer timings": f"CHANNELS_PRESENCE_MAX_AGE {PEER_MAX_AGE_S} s, heartbeat {PEER_HEARTBEAT_S} s, "
            f"prune every {PEER_PRUNE_S} s",
        },
    }
    targets = {**TARGETS, **{key: target for phase in PHASES for key, target in phase.targets.items()}}
    write_results(args.out, bench.results, context, bench.steps, mode, targets, failures)
    if failures:
        say(f"done in {context['seconds']} s; FAILED: {', '.join(failures)} (logs kept in {workdir})")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    say(f"done in {context['seconds']} s: {args.out / 'latest.json'} and latest.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
