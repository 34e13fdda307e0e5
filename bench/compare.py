"""The phases that compare what users feel and what size costs: behaviours, a dead instance's crowd,
a big room's deploy, paced connects. Run by bench/run.py (`--only behaviours reap bigroom paced`).
"""

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.harness import (
    CHURN_TIMINGS,
    PEER_HEARTBEAT_S,
    LoadGen,
    Peer,
    Server,
    Sizes,
    World,
    daphne,
    open_and_close,
    peer_users,
    redis_cpu_seconds,
    say,
    thread_cpu_seconds,
)

# Relay's defaults (relay/settings.py): a reconnect inside the 30 s grace is no transition at all.
DEFAULT_TIMINGS: dict[str, str] = {}
FLICKER_GAP_S = 1.0


def _relay_url(world: World, server: Server, user: str) -> str:
    return server.ws_url(f"token={world.token(user)}")


def _peer_url(channel_of: dict[str, str]) -> Any:
    return lambda world, server, user: server.ws_url(f"user={user}&channels={channel_of[user]}")


def _pair(world: World, workdir: Path, kind: str, name: str, channel_of: dict[str, str], timings: dict) -> tuple:
    """Two instances of Relay or of the peer, a stop for both, and how a user's URL is made."""
    if kind == "peer":
        peer = Peer(name, workdir)
        return peer.servers, peer.stop, _peer_url(channel_of)
    servers = [daphne(f"{name}-{index}", workdir, **timings) for index in range(2)]

    def stop() -> None:
        for server in servers:
            server.stop()

    return servers, stop, _relay_url


def _small_world(world: World, prefix: str, watchers: int) -> tuple[str, list[str], dict[str, str]]:
    subject = world.users(f"{prefix}-s", 1)[0]
    watcher_ids = world.users(f"{prefix}-w", watchers)
    channel = world.channel(prefix, [subject, *watcher_ids])
    peer_users([subject, *watcher_ids])
    return subject, watcher_ids, dict.fromkeys([subject, *watcher_ids], channel)


def flicker(world: World, workdir: Path, kind: str) -> dict:
    """Frames a watcher receives when a user's socket drops and reconnects 1 s later."""
    subject, watchers, channel_of = _small_world(world, f"{kind}-flicker", 5)
    (a, b), stop, url = _pair(world, workdir, kind, f"{kind}-flicker", channel_of, DEFAULT_TIMINGS)
    try:
        load = LoadGen(
            {
                "scenario": "flicker",
                "watchers": [{"url": url(world, b, w), "subjects": [subject]} for w in watchers],
                "subject": {"user": subject, "url": url(world, a, subject)},
                "gap": FLICKER_GAP_S,
                "settle": 2.0,
                "heartbeat": PEER_HEARTBEAT_S if kind == "peer" else 0.0,
            }
        )
        result = load.finish()
    finally:
        stop()
    say(f"flicker ({kind}): {result['frames_per_watcher']} frames per watcher for a {FLICKER_GAP_S:g} s reconnect")
    return result


def dead_instance(
    world: World,
    workdir: Path,
    kind: str,
    users: int,
    per_channel: int,
    label: str = "",
    env: Mapping[str, str] | None = None,
) -> dict:
    """`users` on an instance that is SIGKILLed; one watcher per channel on each of two survivors.

    `label` names the users and servers (`kind` by default); `env`, more settings for Relay's
    servers. Returns the load generator's result: first/last offline after the kill, in ms.
    """
    prefix = f"{label or kind}-dead{users}"
    subjects = world.users(f"{prefix}-s", users)
    channel_of: dict[str, str] = {}
    specs = []
    for start in range(0, users, per_channel):
        members = subjects[start : start + per_channel]
        watchers = world.users(f"{prefix}-w{start}", 2)
        channel = world.channel(f"{prefix}-{start}", members + watchers)
        channel_of.update(dict.fromkeys(members + watchers, channel))
        specs += [{"user": w, "subjects": members, "survivor": index} for index, w in enumerate(watchers)]
    if kind == "peer":
        peer_users(list(channel_of))
        peer = Peer(prefix, workdir, count=3)
        survivors, doomed, stop, url = peer.servers[:2], peer.servers[2], peer.stop, _peer_url(channel_of)
    else:
        servers = [daphne(f"{prefix}-{index}", workdir, **CHURN_TIMINGS, **(env or {})) for index in range(3)]
        survivors, doomed, url = servers[:2], servers[2], _relay_url

        def stop() -> None:
            for server in servers:
                server.stop()

    try:
        load = LoadGen(
            {
                "scenario": "dead_instance",
                "watchers": [
                    {"url": url(world, survivors[w["survivor"]], w["user"]), "subjects": w["subjects"]} for w in specs
                ],
                "subjects": [{"user": s, "url": url(world, doomed, s)} for s in subjects],
                "concurrency": 100,
                "heartbeat": PEER_HEARTBEAT_S if kind == "peer" else 0.0,
            }
        )
        load.expect("ready")
        doomed.process.kill()
        killed = time.monotonic()
        load.process.stdin.write(f"{killed}\n")
        load.process.stdin.flush()
        result = load.finish()
    finally:
        stop()
    say(
        f"dead instance ({kind}, {users} users): offline seen {result['first_ms']}-{result['last_ms']} ms "
        f"after the kill, {result['missing']} of {result['pairs']} never"
    )
    return result


def phase_behaviours(world: World, workdir: Path, with_peer: bool) -> dict:
    """What a user sees: a reconnect's flicker, and how long a dead instance's user stays online."""
    results: dict[str, Any] = {}
    for kind in ("relay", "peer") if with_peer else ("relay",):
        prefix = "peer." if kind == "peer" else ""
        frames = flicker(world, workdir, kind)
        ghost = dead_instance(world, workdir, kind, 1, 1)
        results[f"{prefix}reconnect_flicker_frames"] = frames["frames_per_watcher"]
        results[f"{prefix}ghost_seconds"] = round(ghost["last_ms"] / 1000, 2)
        results[f"_{kind}_ghost_missing"] = ghost["missing"]
    return results


def phase_reap(
    world: World, workdir: Path, sizes: Sizes, label: str = "", env: Mapping[str, str] | None = None
) -> dict:
    """A SIGKILLed instance's `reap_users` users, two survivors: when their watchers see each go offline.

    Black-box: the timestamps of `offline` frames at watchers. The bound at the bench timings is
    TTL + grace + 2 x refresh (the last refresh before the kill, and one reaper pass).
    """
    result = dead_instance(world, workdir, "relay", sizes.reap_users, 50, label, env)
    span = max(result["last_ms"] - result["first_ms"], 1.0) / 1000
    bound = sum(int(CHURN_TIMINGS[k]) for k in ("RELAY_PRESENCE_TTL_MS", "RELAY_PRESENCE_GRACE_MS"))
    bound += 2 * int(CHURN_TIMINGS["RELAY_PRESENCE_REFRESH_MS"])
    return {
        "reap.users": sizes.reap_users,
        "reap.users_per_s": round(sizes.reap_users / span),
        "reap.last_offline_after_ms": result["last_ms"],
        "_reap_first_offline_after_ms": result["first_ms"],
        "_reap_missing_pairs": result["missing"],
        "_reap_bound_ms": bound,
    }


def _deploy(world: World, workdir: Path, sizes: Sizes, redis_client: Any, room_size: int) -> dict:
    """`bigroom_members` users in rooms of `room_size`, on two instances, all reconnecting within the window."""
    count = sizes.bigroom_members
    users = world.users(f"deploy{room_size}", count)
    for start in range(0, count, room_size):
        world.channel(f"deploy{room_size}-{start}", users[start : start + room_size])
    servers = [daphne(f"relay-deploy{room_size}-{index}", workdir) for index in range(2)]
    try:
        for server in servers:
            open_and_close([_relay_url(world, server, users[0])])
        load = LoadGen(
            {
                "scenario": "bigroom",
                "members": [
                    {"url": _relay_url(world, servers[index % 2], uid), "expect": min(room_size, count)}
                    for index, uid in enumerate(users)
                ],
                "window": sizes.bigroom_window,
            }
        )
        ready = load.expect("ready")
        cpu_before = sum(thread_cpu_seconds(server.pid) for server in servers)
        redis_before = redis_cpu_seconds(redis_client)
        started = time.monotonic()
        load.release()
        load.expect("converged")
        seconds = time.monotonic() - started
        cpu = sum(thread_cpu_seconds(server.pid) for server in servers) - cpu_before
        redis_cpu = redis_cpu_seconds(redis_client) - redis_before
        result = load.finish()
    finally:
        for server in servers:
            server.stop()
    result.update(
        cpu_ms_per_reconnect=round(1000 * cpu / count, 3),
        redis_cpu_pct=round(100 * redis_cpu / seconds, 1),
        redis_cpu_ms_per_reconnect=round(1000 * redis_cpu / count, 3),
        fill_frames=ready["frames"],
    )
    say(
        f"deploy, rooms of {room_size}: converged in {result['converge_s']} s ({result['not_converged']} not), "
        f"{result['cpu_ms_per_reconnect']} ms instance CPU and {result['redis_cpu_ms_per_reconnect']} ms Redis CPU "
        f"per reconnect, Redis {result['redis_cpu_pct']} %, snapshot {result['snapshot_bytes']} bytes"
    )
    return result


def phase_bigroom(world: World, workdir: Path, sizes: Sizes, redis_client: Any) -> dict:
    """One room of `bigroom_members` against rooms of 5, the same users reconnecting within the window."""
    big = _deploy(world, workdir, sizes, redis_client, sizes.bigroom_members)
    redis_client.flushall()
    small = _deploy(world, workdir, sizes, redis_client, 5)
    ratio = big["cpu_ms_per_reconnect"] / small["cpu_ms_per_reconnect"] if small["cpu_ms_per_reconnect"] else 0.0
    return {
        "bigroom.members": sizes.bigroom_members,
        "bigroom.converge_s": big["converge_s"],
        "bigroom.redis_cpu_pct": big["redis_cpu_pct"],
        "bigroom.snapshot_bytes": big["snapshot_bytes"],
        "ratio.bigroom_connect_cpu_vs_small": round(ratio, 3),
        "_spread:ratio.bigroom_connect_cpu_vs_small": "one deploy each",
        "_bigroom_cpu_ms_per_reconnect": big["cpu_ms_per_reconnect"],
        "_bigroom_redis_cpu_ms_per_reconnect": big["redis_cpu_ms_per_reconnect"],
        "_bigroom_not_converged": big["not_converged"],
        "_smallroom_cpu_ms_per_reconnect": small["cpu_ms_per_reconnect"],
        "_smallroom_redis_cpu_ms_per_reconnect": small["redis_cpu_ms_per_reconnect"],
        "_smallroom_converge_s": small["converge_s"],
        "_smallroom_snapshot_bytes": small["snapshot_bytes"],
    }


def switches(pid: int) -> int:
    """Voluntary context switches of a process's live threads: each is a thread going to sleep to wait."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total


def _connects(server: Server, urls: list[str], rate: float) -> tuple[float, float, float]:
    """CPU ms and voluntary context switches per connect for these connects, and their seconds."""
    cpu, woken, started = thread_cpu_seconds(server.pid), switches(server.pid), time.monotonic()
    load = LoadGen({"scenario": "idle", "urls": urls, "concurrency": 50, "rate": rate})
    load.expect("ready")
    seconds = time.monotonic() - started
    cpu, woken = thread_cpu_seconds(server.pid) - cpu, switches(server.pid) - woken
    load.release()
    load.finish()
    time.sleep(0.5)
    return 1000 * cpu / len(urls), woken / len(urls), seconds


def phase_paced(world: World, workdir: Path, sizes: Sizes) -> dict:
    """Server CPU per connect with connects in a burst (50 in flight) and paced at `paced_rate` per second.

    Relay and the bare consumer, each user a channel of their own (as the connect CPU phase). The
    idle instance's own CPU over the paced window is measured too: the background a paced
    connect's share would include.
    """
    results: dict[str, Any] = {}
    count = sizes.paced_connections
    for kind in ("relay", "bare"):
        users = world.users(f"paced-{kind}", 2 * count + 1)
        channel_of = {uid: world.channel(f"paced-{uid}", [uid]) for uid in users}
        app = {"app": "bench.bare:application"} if kind == "bare" else {}
        server = daphne(f"{kind}-paced", workdir, **app)
        try:

            def url(uid: str, server: Server = server, kind: str = kind, channel_of: dict = channel_of) -> str:
                if kind == "bare":
                    return server.ws_url(f"channels={channel_of[uid]}")
                return _relay_url(world, server, uid)

            open_and_close([url(users[0])])
            idle_cpu = thread_cpu_seconds(server.pid)
            time.sleep(count / sizes.paced_rate)
            idle_cpu = thread_cpu_seconds(server.pid) - idle_cpu
            burst = _connects(server, [url(u) for u in users[1 : count + 1]], 0.0)
            paced = _connects(server, [url(u) for u in users[count + 1 :]], sizes.paced_rate)
        finally:
            server.stop()
        say(
            f"paced ({kind}): burst {burst[0]:.2f} ms and {burst[1]:.1f} waits per connect, "
            f"paced at {sizes.paced_rate:g}/s {paced[0]:.2f} ms and {paced[1]:.1f} waits; idle instance "
            f"{1000 * idle_cpu / count:.3f} ms per connect-interval"
        )
        prefix = "" if kind == "relay" else "_bare_"
        results[f"{prefix}connect_cpu_ms.burst"] = round(burst[0], 3)
        results[f"{prefix}connect_cpu_ms.paced"] = round(paced[0], 3)
        results[f"_{kind}_connect_waits.burst"] = round(burst[1], 2)
        results[f"_{kind}_connect_waits.paced"] = round(paced[1], 2)
        results[f"_{kind}_idle_cpu_ms_per_paced_connect"] = round(1000 * idle_cpu / count, 3)
    results["ratio.connect_cpu_paced_vs_burst"] = round(
        results["connect_cpu_ms.paced"] / results["connect_cpu_ms.burst"], 3
    )
    results["_spread:ratio.connect_cpu_paced_vs_burst"] = "one round"
    return results
