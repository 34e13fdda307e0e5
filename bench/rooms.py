"""Rooms by size: arrivals into a mid-sized channel (`midroom`). Run by bench/run.py (`--only midroom`).

`midroom`: 100 arrivals a second into a 320-member channel watched by 20 (on the other
instance), each subject holding its socket half a second. Keys: `midroom.notify_p99_ms` (the
watcher hears `online` after the subject's connect began) and `midroom.redis_cmds_per_connect`:
every command Redis ran in the window (INFO commandstats counts those a Lua script runs too)
over the connects made in it.
"""

from pathlib import Path
from typing import Any

from bench.harness import World, daphne, open_and_close, redis_calls, run_job, say

# (members, watchers, arrivals per second, seconds of arrivals) per mode.
MIDROOM = {"full": (320, 20, 100, 3.0), "quick": (320, 20, 100, 3.0), "smoke": (24, 4, 20, 1.0)}


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
