"""`cluster`: the churn and reap measurements on a 3-master Redis Cluster beside one Redis, and a master killed.

The cluster is devtools/redis_cluster.py's (3 masters with a replica each, node timeout 500 ms),
Relay's channel layer and presence both on it (RELAY_REDIS_CLUSTER_NODES, docs/scaling.md). The
same churn climb and the same dead instance run on the bench's one Redis and on the cluster in
this phase, one after the other, so the two figures of each pair saw the same machine. During the
cluster's climb each master's `INFO cpu` is read around every step: the busiest master's share of
the masters' CPU says how evenly presence and the layer spread over the shards.

Then a failover under load: steady users and two watchers per channel are connected across two
instances while subjects connect and disconnect at a moderate rate; one master (the one holding
the first steady user's presence keys) is SIGKILLed, and its replica takes over in about the
node timeout plus an election, well inside the TTL. Every `offline` a watcher receives for a
user whose connection stayed open is a false one; once the churn is over and a TTL has passed
since the failover, every watcher's view (its snapshot and every change since) should hold each
steady user of its channel and no subject.
"""

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from bench import compare
from bench.harness import CHURN_TIMINGS, Bench, LoadGen, Server, daphne, say
from bench.loadgen import _open_many, _paced, _quiet, emit, progress, wait_line
from devtools.redis_cluster import EmbeddedRedisCluster, find_cluster_redis_server


@dataclass(frozen=True)
class ClusterSizes:
    # The churn climb, run on one Redis and on the cluster (pairs per second, seconds a step).
    churn_rates: tuple[int, ...]
    churn_seconds: float
    # Users on the instance SIGKILLed in each reap run.
    reap_users: int
    # The failover: steady users (beside two watchers a channel) in `failover_channels` channels,
    # subjects connecting and disconnecting at `failover_rate` a second for `failover_churn_s`,
    # the master killed `failover_lead_s` into the churn.
    failover_steady: int
    failover_channels: int
    failover_rate: float
    failover_churn_s: float
    failover_lead_s: float


SIZES = {
    "full": ClusterSizes((50, 100, 150, 200, 300, 400, 500, 600, 800), 3.0, 2000, 1000, 25, 40, 10.0, 3.0),
    "quick": ClusterSizes((50, 100, 150, 200, 300), 2.0, 1000, 200, 10, 30, 6.0, 2.0),
    "smoke": ClusterSizes((20,), 1.0, 40, 20, 2, 10, 3.0, 1.0),
}
TARGETS = {
    "cluster.busiest_shard_cpu_share": ("<=", 0.5),
    "cluster.failover_false_offline": ("<=", 0),
    "cluster.failover_unconverged_watchers": ("<=", 0),
}
# A TTL well past the failover (about 2 s with the 500 ms node timeout), as the live cluster tests
# use: the promoted replica's keys, refreshed every 0.5 s, outlive the gap.
FAILOVER_TIMINGS = {**CHURN_TIMINGS, "RELAY_PRESENCE_TTL_MS": "6000", "RELAY_PRESENCE_REFRESH_MS": "500"}
# How long after the failover a false `offline` could still come: TTL + grace + 2 x refresh.
FAILOVER_WATCH_S = sum(int(FAILOVER_TIMINGS[k]) for k in ("RELAY_PRESENCE_TTL_MS", "RELAY_PRESENCE_GRACE_MS")) / 1000
FAILOVER_WATCH_S += 2 * int(FAILOVER_TIMINGS["RELAY_PRESENCE_REFRESH_MS"]) / 1000
# After that, how long the watchers' views may take to come right before they count as not converged.
CONVERGE_S = 10.0


def run(bench: Bench, sizes: ClusterSizes, churn: Callable[..., tuple[dict, list[dict]]]) -> dict:
    """The phase; `churn` is bench/run.py's churn climb (`phase_churn`)."""
    if find_cluster_redis_server() is None:
        say("cluster: skipped, Redis Cluster needs redis-server 7 or later (apt-get install redis-server)")
        return {"_cluster": "skipped: redis-server 7 or later is not installed"}
    with EmbeddedRedisCluster() as cluster:
        masters = [redis.Redis(host="127.0.0.1", port=node.port) for node in cluster.masters()]
        on_cluster = {"RELAY_REDIS_CLUSTER_NODES": cluster.nodes_setting}
        try:
            results = _churn(bench, sizes, churn, cluster, masters, on_cluster)
            results.update(_reap(bench, sizes, cluster, on_cluster))
            cluster.flush()
            results.update(_failover(bench, sizes, cluster))
        finally:
            for master in masters:
                master.close()
    return results


def _churn(
    bench: Bench,
    sizes: ClusterSizes,
    churn: Callable[..., tuple[dict, list[dict]]],
    cluster: EmbeddedRedisCluster,
    masters: list[Any],
    on_cluster: dict[str, str],
) -> dict:
    climb = dataclasses.replace(bench.sizes, churn_rates=sizes.churn_rates, churn_seconds=sizes.churn_seconds)
    bench.redis.flushall()
    single, single_steps = churn(bench.world, bench.workdir, climb, [bench.redis], label="relay-one-redis")
    cluster.flush()
    clustered, steps = churn(bench.world, bench.workdir, climb, masters, label="relay-cluster", env=on_cluster)
    bench.steps += single_steps + steps
    # Every step of the climb, the one that was not held included: the load is the point, not the rate.
    by_master = [sum(step["redis_cpu_seconds_by_node"][index] for step in steps) for index in range(len(masters))]
    share = max(by_master) / sum(by_master) if sum(by_master) else 0.0
    say(
        f"cluster churn: {clustered['transitions.max_per_s']}/s held on the cluster, "
        f"{single['transitions.max_per_s']}/s on one Redis; masters' CPU "
        f"{', '.join(f'{seconds:.2f}' for seconds in by_master)} s (busiest {share:.2f})"
    )
    return {
        "cluster.transitions_max_per_s": clustered["transitions.max_per_s"],
        "cluster.one_redis_transitions_max_per_s": single["transitions.max_per_s"],
        "cluster.busiest_shard_cpu_share": round(share, 3),
        "_cluster_masters_cpu_seconds": " ".join(f"{seconds:.3f}" for seconds in by_master),
        # The first rate of both climbs, comparable even where neither held it (a loaded machine).
        "_cluster_first_step_p99_ms": steps[0]["p99_ms"],
        "_cluster_one_redis_first_step_p99_ms": single_steps[0]["p99_ms"],
        "_cluster_first_step_frames_per_s": steps[0]["frames_per_s"],
        "_cluster_one_redis_first_step_frames_per_s": single_steps[0]["frames_per_s"],
    }


def _reap(bench: Bench, sizes: ClusterSizes, cluster: EmbeddedRedisCluster, on_cluster: dict[str, str]) -> dict:
    users = dataclasses.replace(bench.sizes, reap_users=sizes.reap_users)
    bench.redis.flushall()
    single = compare.phase_reap(bench.world, bench.workdir, users, label="relay-one-redis")
    cluster.flush()
    clustered = compare.phase_reap(bench.world, bench.workdir, users, label="relay-cluster", env=on_cluster)
    say(
        f"cluster reap ({sizes.reap_users} users): {clustered['reap.users_per_s']}/s on the cluster, "
        f"{single['reap.users_per_s']}/s on one Redis"
    )
    return {
        "cluster.reap_users": sizes.reap_users,
        "cluster.reap_users_per_s": clustered["reap.users_per_s"],
        "cluster.one_redis_reap_users_per_s": single["reap.users_per_s"],
        "cluster.reap_last_offline_after_ms": clustered["reap.last_offline_after_ms"],
        "_cluster_reap_missing_pairs": clustered["_reap_missing_pairs"],
        "_cluster_one_redis_reap_last_offline_after_ms": single["reap.last_offline_after_ms"],
        # The span the rate is counted over starts at the first `offline`: one before the TTL (an
        # instance late with its refresh on a loaded machine) stretches it.
        "_cluster_reap_first_offline_after_ms": clustered["_reap_first_offline_after_ms"],
        "_cluster_one_redis_reap_first_offline_after_ms": single["_reap_first_offline_after_ms"],
    }


def _failover(bench: Bench, sizes: ClusterSizes, cluster: EmbeddedRedisCluster) -> dict:
    from presence.scripts import presence_key

    world = bench.world
    channels = sizes.failover_channels
    steady = world.users("failover-steady", sizes.failover_steady)
    subjects = world.users("failover-subject", int(sizes.failover_rate * sizes.failover_churn_s))
    watchers = world.users("failover-watcher", 2 * channels)
    specs = []
    for index in range(channels):
        pair = watchers[2 * index : 2 * index + 2]
        members, churning = steady[index::channels], subjects[index::channels]
        world.channel(f"failover-{index}", [*pair, *members, *churning])
        # Each watcher also watches the other: it stays connected throughout as well.
        specs += [
            {"user": user, "instance": n, "steady": [*members, pair[1 - n]], "churning": churning}
            for n, user in enumerate(pair)
        ]
    env = {**FAILOVER_TIMINGS, "RELAY_REDIS_CLUSTER_NODES": cluster.nodes_setting}
    servers = [daphne(f"relay-failover-{n}", bench.workdir, **env) for n in range(2)]
    victim = cluster.master_of(presence_key(str(world.environment.id), steady[0]))
    load = None
    try:

        def url(n: int, user: str) -> str:
            return servers[n % 2].ws_url(f"token={world.token(user)}")

        load = LoadGen(
            {
                "scenario": "bench.cluster:failover",
                "watchers": [{**spec, "url": url(spec["instance"], spec["user"])} for spec in specs],
                "steady": [{"user": user, "url": url(n, user)} for n, user in enumerate(steady)],
                "subjects": [{"user": user, "url": url(n, user)} for n, user in enumerate(subjects)],
                "rate": sizes.failover_rate,
                "hold": 0.05,
                "watch_s": FAILOVER_WATCH_S,
                "converge_s": CONVERGE_S,
            }
        )
        load.expect("ready")
        load.release()
        time.sleep(sizes.failover_lead_s)
        killed = time.monotonic()
        cluster.kill_master(victim)
        promoted = time.monotonic()
        load.process.stdin.write(f"{killed} {promoted}\n")
        load.process.stdin.flush()
        result = load.finish()
    finally:
        if load:
            load.kill()
        for server in servers:
            server.stop()
    failed = len(_events(servers, "presence.failed"))
    # Each user a watcher still saw online after the churn, and whether an instance published its
    # `offline` (then the layer lost it) or never decided it.
    published = {line["user"] for line in _events(servers, "presence.published") if line.get("state") == "offline"}
    ghosts = " ".join(f"{user}({'published' if user in published else 'never published'})" for user in result["ghosts"])
    say(
        f"cluster failover: master on port {victim.port} killed, replica serving after {promoted - killed:.2f} s; "
        f"{result['false_offline']} false offline frames, {result['unconverged']} of {result['watchers']} watchers "
        f"not converged ({result['converged_after_churn_s']} s after the churn's end), "
        f"{result['dropped']} steady connections dropped, {failed} presence.failed lines"
    )
    return {
        "cluster.failover_seconds": round(promoted - killed, 2),
        "cluster.failover_false_offline": result["false_offline"],
        "cluster.failover_unconverged_watchers": result["unconverged"],
        "_cluster_failover_converged_after_churn_s": result["converged_after_churn_s"],
        "_cluster_failover_churn_after_kill_s": result["churn_after_kill_s"],
        "_cluster_failover_steady_users": sizes.failover_steady,
        "_cluster_failover_watchers": result["watchers"],
        "_cluster_failover_subjects": len(subjects),
        "_cluster_failover_steady_dropped": result["dropped"],
        "_cluster_failover_subject_failures": result["subject_failures"],
        "_cluster_failover_presence_failed_lines": failed,
        "_cluster_failover_ghosts": ghosts or "none",
        "_cluster_failover_steady_missing": " ".join(result["missing"]) or "none",
    }


def _events(servers: list[Server], event: str) -> list[dict]:
    """The JSON log lines of `event` the servers wrote."""
    found = []
    for server in servers:
        for raw in server.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                line = json.loads(raw)
                if isinstance(line, dict) and line.get("event") == event:
                    found.append(line)
    return found


# ── the load-generator scenario (`python -m bench.loadgen` runs it by name) ───
async def failover(job: dict) -> None:
    """Steady users and watchers connected, subjects churning; the harness kills a master meanwhile.

    On "go" the churn starts; the harness then sends the monotonic instants of the kill and of the
    promotion. The verdict waits for the churn to end and `watch_s` past the promotion, then up to
    `converge_s` more for every watcher's view to hold its channel's steady users and no subject.
    """
    watchers = await _open_many([spec["url"] for spec in job["watchers"]], 100, track=True)
    held = await _open_many([spec["url"] for spec in job["steady"]], 100)
    await _quiet(watchers, 1.0, 60)
    emit("ready", watchers=len(watchers), steady=len(held))
    await wait_line()
    opened: dict[str, float] = {}
    churning = asyncio.create_task(
        _paced([(s["user"], s["url"]) for s in job["subjects"]], job["rate"], job["hold"], opened)
    )
    killed, promoted = (float(value) for value in (await wait_line()).split())
    _, cycles = await churning
    subject_failures = sum(1 for outcome in await cycles if isinstance(outcome, BaseException))
    ended = time.perf_counter()
    # A steady user is one whose connection stayed open throughout: the watchers and the held users.
    connections = {
        **{spec["user"]: w for spec, w in zip(job["watchers"], watchers, strict=True)},
        **{spec["user"]: w for spec, w in zip(job["steady"], held, strict=True)},
    }
    pairs = list(zip(job["watchers"], watchers, strict=True))

    def converged(spec: dict, watcher: Any) -> bool:
        return set(spec["steady"]) <= watcher.view and not watcher.view & set(spec["churning"])

    # Watched until `watch_s` past the promotion (a false `offline` comes by then or not at all),
    # then until the views are right or `converge_s` more have passed; converged: since when the
    # views have all been right (from the churn's last close: each `offline` comes a grace later).
    watched, converged_at = promoted + job["watch_s"], None
    while True:
        now = time.perf_counter()
        right = all(converged(spec, w) for spec, w in pairs)
        converged_at = (converged_at or now) if right else None
        if now >= watched and (converged_at or now >= watched + job["converge_s"]):
            break
        await asyncio.sleep(0.05)
    unconverged = [w for spec, w in pairs if not converged(spec, w)]
    stayed = {user for user, connection in connections.items() if connection.ws.close_code is None}
    false_offline = sum(w.offline[user] for spec, w in pairs for user in spec["steady"] if user in stayed)
    ghosts = sorted({user for spec, w in pairs for user in w.view & set(spec["churning"])})
    missing = sorted({user for spec, w in pairs for user in set(spec["steady"]) - w.view})
    if unconverged:
        progress(
            f"{len(unconverged)} watchers not converged: subjects seen online {ghosts}, steady users not {missing}"
        )
    await asyncio.gather(*(w.close() for w in [*watchers, *held]), return_exceptions=True)
    emit(
        "result",
        watchers=len(watchers),
        false_offline=false_offline,
        unconverged=len(unconverged),
        converged_after_churn_s=round(converged_at - ended, 2) if converged_at else 0.0,
        churn_after_kill_s=round(ended - killed, 2),
        dropped=len(connections) - len(stayed),
        subject_failures=subject_failures,
        ghosts=ghosts,
        missing=missing,
    )
