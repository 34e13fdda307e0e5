"""What a bench run writes: latest.json, latest.md, and the results block of docs/performance.md.

latest.json holds every public key (a number); latest.md adds the spreads, the supporting numbers
(keys starting with `_`), the churn steps, the phases that failed, the machine, versions and
settings. A key is judged against its target when one is declared (`TARGETS` here for the core
phases, `Phase.targets` in bench/run.py's table for the others).
"""

import json
import operator
import os
import platform
from collections.abc import Mapping
from pathlib import Path

from bench.harness import BASE_DIR

RESULTS = BASE_DIR / "bench" / "results"
DOCS = BASE_DIR / "docs" / "performance.md"
DOCS_START, DOCS_END = "<!-- bench results: written by `make bench` -->", "<!-- end of bench results -->"
COMMANDS = {"full": "make bench", "quick": "make bench-quick", "smoke": "python -m bench.run --smoke"}

Targets = Mapping[str, tuple[str, float]]
COMPARE = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}

# At the bench timings (harness.CHURN_TIMINGS): TTL + grace + 2 x refresh.
REAP_BOUND_MS = 3000 + 300 + 2 * 1000
# What is judged among the core phases' keys; everything else is a reported number.
TARGETS: Targets = {
    # The default bound (RELAY_MAX_PENDING_BYTES, 4 MiB) plus 8.
    "slow_reader.rss_growth_mb": ("<=", 12),
    "slow_reader.healthy_delivered_ratio": (">=", 1.0),
    "ratio.transitions_vs_peer": (">=", 2),
    "ratio.connect_cpu_vs_peer": ("<=", 0.5),
    "ratio.bigroom_connect_cpu_vs_small": ("<=", 3),
    "reconnect_flicker_frames": ("<=", 0),
    "reap.last_offline_after_ms": ("<=", REAP_BOUND_MS),
}

# Relay beside the peer in latest.md and docs/performance.md: (what, Relay's key, the peer's key).
SIDE_BY_SIDE = (
    ("online seen by a watcher, p50 ms (100 transitions/s x 20 watchers)", "notify.p50_ms", "peer.notify.p50_ms"),
    ("online seen by a watcher, p99 ms", "notify.p99_ms", "peer.notify.p99_ms"),
    ("transitions/s held (p99 <= 250 ms)", "transitions.max_per_s", "peer.transitions.max_per_s"),
    ("server CPU per connect, ms", "connect_cpu_ms", "peer.connect_cpu_ms"),
    ("frames per watcher per transition", "frames_per_transition", "peer.frames_per_transition"),
    ("bytes per presence frame (rooms of ~40)", "bytes_per_frame", "peer.bytes_per_frame"),
    ("frames a watcher gets for a 1 s reconnect", "reconnect_flicker_frames", "peer.reconnect_flicker_frames"),
    ("seconds a SIGKILLed instance's user stays online", "ghost_seconds", "peer.ghost_seconds"),
)

# The cluster phase's pairs, measured one after the other in the same run: (what, one Redis, the cluster).
CLUSTER_BESIDE_ONE_REDIS = (
    ("transitions/s held (p99 <= 250 ms)", "cluster.one_redis_transitions_max_per_s", "cluster.transitions_max_per_s"),
    (
        "a SIGKILLed instance's users seen offline per second",
        "cluster.one_redis_reap_users_per_s",
        "cluster.reap_users_per_s",
    ),
)


def versions(redis_server_version: str) -> dict:
    import channels
    import channels_redis
    import daphne as daphne_module
    import django
    import orjson
    import redis
    import uvloop

    return {
        "python": platform.python_version(),
        "django": django.get_version(),
        "channels": channels.__version__,
        "channels_redis": channels_redis.__version__,
        "daphne": daphne_module.__version__,
        "redis-py": redis.__version__,
        "uvloop": uvloop.__version__,
        "orjson": orjson.__version__,
        "redis-server": redis_server_version,
    }


def machine() -> dict:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    memory_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
    }


def verdict(targets: Targets, key: str, value: float) -> str:
    if key not in targets:
        return ""
    op, target = targets[key]
    met = COMPARE[op](value, target)
    return f"{'met' if met else 'MISSED'} ({op} {target})"


def side_by_side(results: dict, pairs: tuple = SIDE_BY_SIDE, heads: tuple[str, str] = ("Relay", "peer")) -> list[str]:
    """A two-column table (Relay against the peer by default), for the rows both sides have."""
    rows = [(what, results[a], results[b]) for what, a, b in pairs if a in results and b in results]
    if not rows:
        return []
    return [f"| | {heads[0]} | {heads[1]} |", "|---|---|---|", *(f"| {what} | {a} | {b} |" for what, a, b in rows)]


def cluster_beside_one_redis(results: dict) -> list[str]:
    """The cluster phase's table, when it ran."""
    table = side_by_side(results, CLUSTER_BESIDE_ONE_REDIS, ("one Redis", "Redis Cluster, 3 masters"))
    return ["", "## Redis Cluster beside one Redis, same run", "", *table] if table else []


def results_table(results: dict, targets: Targets, judged_only: bool = False) -> list[str]:
    public = {key: value for key, value in results.items() if not key.startswith("_")}
    if judged_only:
        public = {key: value for key, value in public.items() if key in targets}
    lines = ["| key | value | spread | target |", "|---|---|---|---|"]
    return lines + [
        f"| `{key}` | {value} | {results.get(f'_spread:{key}', '')} | {verdict(targets, key, value)} |"
        for key, value in sorted(public.items())
    ]


def failures_section(failures: Mapping[str, str], workdir: Path | None) -> list[str]:
    """What each failed phase said, and where the servers' logs were kept."""
    if not failures:
        return []
    lines = ["", "## Phases that failed", "", f"The servers' logs are kept in `{workdir}`.", ""]
    for name, why in failures.items():
        lines += [f"### {name}", "", "```", why, "```", ""]
    return lines


def write_results(
    out: Path,
    results: dict,
    context: dict,
    steps: list[dict],
    mode: str,
    targets: Targets,
    failures: Mapping[str, str],
) -> None:
    """latest.json (every key, a number) and latest.md, written from the same results."""
    out.mkdir(parents=True, exist_ok=True)
    public = {key: value for key, value in results.items() if not key.startswith("_")}
    (out / "latest.json").write_text(json.dumps(public, indent=2, sort_keys=True) + "\n")
    lines = [
        f"# Relay benchmark ({mode})",
        "",
        f"Run {context['started']} in {context['seconds']} s: `{COMMANDS[mode]}`.",
        *failures_section(failures, context.get("workdir")),
        "",
        "## Results",
        "",
        *results_table(results, targets),
        "",
        "## Relay and the peer (django-channels-presence-4-0), same run",
        "",
        *(side_by_side(results) or [f"Peer {context['settings']['peer']}."]),
        *cluster_beside_one_redis(results),
    ]
    lines += ["", "## Supporting numbers", "", "| measurement | value |", "|---|---|"]
    lines += [
        f"| {key[1:]} | {value} |"
        for key, value in sorted(results.items())
        if key.startswith("_") and not key.startswith("_spread:")
    ]
    lines += [
        "",
        "## Churn steps (connect/disconnect pairs per second)",
        "",
        "Relay, the bare fan-out consumer (bench/bare.py) and the peer under the same load; the cluster phase's "
        "climbs, Relay on one Redis and on the cluster, with their own rates.",
        "",
        "CPU: % of one core during the step's window (2 cores = 200 %).",
        "",
        "| server | rate | achieved | p50 ms | p99 ms | frames/s | missing online/offline "
        "| CPU both instances | CPU load generator | CPU Redis |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['server']} | {s['rate']} | {s['achieved_rate']} | {s['p50_ms']} | {s['p99_ms']} | {s['frames_per_s']} "
        f"| {s['missing_online']}/{s['missing_offline']} | {s['cpu_pct_servers']} % | {s['cpu_pct_loadgen']} % "
        f"| {s['cpu_pct_redis']} % |"
        for s in steps
    ]
    lines += ["", "## Machine", ""] + [f"- {key}: {value}" for key, value in context["machine"].items()]
    lines += ["", "## Versions", ""] + [f"- {key}: {value}" for key, value in context["versions"].items()]
    lines += ["", "## Settings", ""] + [f"- {key}: {value}" for key, value in context["settings"].items()]
    (out / "latest.md").write_text("\n".join(lines) + "\n")
    # A run with a failed phase does not replace the published numbers.
    if mode == "full" and out == RESULTS and not failures:
        refresh_docs(results, context, targets)


def refresh_docs(results: dict, context: dict, targets: Targets) -> None:
    """The current results in docs/performance.md, between its two markers, from a full run."""
    text = DOCS.read_text()
    if DOCS_START not in text or DOCS_END not in text:
        return
    machine = context["machine"]
    block = [
        DOCS_START,
        f"`make bench`, {context['started']}, {machine['cores']} x {machine['cpu']}, {machine['memory_gib']} GiB.",
        "",
        *side_by_side(results),
        *cluster_beside_one_redis(results),
        "",
        *results_table(results, targets, judged_only=True),
        "",
        "Every other key, the spreads and the supporting numbers: `bench/results/latest.md`.",
        DOCS_END,
    ]
    head, rest = text.split(DOCS_START, 1)
    DOCS.write_text(head + "\n".join(block) + rest.split(DOCS_END, 1)[1])
