"""The benchmark's smoke run, so `make bench` cannot rot: every phase runs and every key is a number.

Timings are not asserted (the suite runs on a shared 2-core machine); the full and quick runs
and their targets are `make bench` / `make bench-quick` (docs/performance.md). The Django peer
(bench/peers/) is installed by the `bench*` make targets only: the main smoke run leaves it out,
and its own smoke run is skipped, saying so, where it is not installed.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import BASE_DIR
from devtools.redis_cluster import find_cluster_redis_server

pytestmark = pytest.mark.heavy

KEYS = {
    "idle.connections",
    "idle.rss_kb_per_connection",
    "idle.cpu_pct_per_1k",
    "notify.p50_ms",
    "notify.p99_ms",
    "notify.rate",
    "notify.watchers",
    "transitions.max_per_s",
    "fanout.frames_per_s",
    "redis.commands_per_connect",
    "redis.commands_per_disconnect",
    "ratio.connect_cpu_vs_bare",
    "ratio.frames_vs_ceiling",
    "layers.pubsub_vs_core_frames",
    "slow_reader.rss_growth_mb",
    "slow_reader.healthy_delivered_ratio",
    "frames_per_transition",
    "bytes_per_frame",
    "connect_cpu_ms",
    "reconnect_flicker_frames",
    "ghost_seconds",
    "reap.users",
    "reap.users_per_s",
    "reap.last_offline_after_ms",
    "bigroom.members",
    "bigroom.converge_s",
    "bigroom.redis_cpu_pct",
    "bigroom.snapshot_bytes",
    "ratio.bigroom_connect_cpu_vs_small",
    "connect_cpu_ms.burst",
    "connect_cpu_ms.paced",
    "ratio.connect_cpu_paced_vs_burst",
    "status.notify_p50_ms",
    "status.notify_p99_ms",
    "status.frames_per_watcher_per_change",
    "status.rate",
    "status.idle_kb_per_connection",
    "webhooks.events_per_s",
    "webhooks.delivery_p99_ms",
    "webhooks.presence_p99_ratio_hanging_receiver",
    "midroom.notify_p99_ms",
    "midroom.redis_cmds_per_connect",
    "hugeroom.connect_cpu_vs_small",
    "hugeroom.redis_cmds_per_connect_vs_small",
    "hugeroom.occupancy_lag_p99_ms",
    "hugeroom.snapshot_bytes",
    "fairness.innocent_p90_ratio",
    "fairness.flooder_rss_growth_mb",
    "fairness.rate_limited_errors",
}
# The cluster phase's, where redis-server 7 is installed (the phase says it skipped otherwise).
CLUSTER_KEYS = {
    "cluster.transitions_max_per_s",
    "cluster.one_redis_transitions_max_per_s",
    "cluster.busiest_shard_cpu_share",
    "cluster.reap_users",
    "cluster.reap_users_per_s",
    "cluster.one_redis_reap_users_per_s",
    "cluster.reap_last_offline_after_ms",
    "cluster.failover_seconds",
    "cluster.failover_false_offline",
    "cluster.failover_unconverged_watchers",
}
PEER_KEYS = {
    "notify.p50_ms",
    "notify.p99_ms",
    "notify.rate",
    "notify.watchers",
    "peer.notify.p50_ms",
    "peer.notify.p99_ms",
    "reconnect_flicker_frames",
    "ghost_seconds",
    "peer.reconnect_flicker_frames",
    "peer.ghost_seconds",
}


def smoke(out: Path, *args: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(out), *args],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((out / "latest.json").read_text())


def not_numbers(results: dict) -> dict:
    return {
        key: value for key, value in results.items() if isinstance(value, bool) or not isinstance(value, float | int)
    }


@pytest.mark.bench
def test_the_smoke_benchmark_writes_every_key_as_a_number(tmp_path: Path) -> None:
    results = smoke(tmp_path, "--no-peer")
    assert set(results) == KEYS | (CLUSTER_KEYS if find_cluster_redis_server() else set())
    assert not_numbers(results) == {}
    # The smoke run really connected: a harness that silently measured nothing would pass the above.
    assert results["idle.connections"] > 0
    assert results["redis.commands_per_connect"] > 0
    assert results["reap.last_offline_after_ms"] > 0 and results["bigroom.snapshot_bytes"] > 0
    assert results["webhooks.events_per_s"] > 0 and results["webhooks.delivery_p99_ms"] > 0
    report = (tmp_path / "latest.md").read_text()
    if find_cluster_redis_server():
        # The masters did the climb's work, the dead instance's users were reaped on the cluster,
        # and a master was killed and a replica took over.
        assert 0 < results["cluster.busiest_shard_cpu_share"] <= 1 and results["cluster.reap_last_offline_after_ms"] > 0
        assert results["cluster.failover_seconds"] > 0
        assert "## Redis Cluster beside one Redis, same run" in report
    else:
        assert "| cluster | skipped: redis-server 7 or later is not installed |" in report
    assert "## Machine" in report and "## Versions" in report and "## Settings" in report
    # Counted under callgrind, or said why not (valgrind is optional).
    assert "| connect_instructions_ratio |" in report or "| connect_instructions | skipped" in report
    assert not (tmp_path / "latest.json").samefile(BASE_DIR / "bench" / "results" / "latest.json")


@pytest.mark.bench
def test_the_peer_runs_beside_relay_where_it_is_installed(tmp_path: Path) -> None:
    if importlib.util.find_spec("channels_presence") is None:
        pytest.skip("django-channels-presence-4-0 is installed by `make bench*` only (bench/requirements.txt)")
    results = smoke(tmp_path, "--only", "notify", "behaviours")
    assert set(results) == PEER_KEYS
    assert not_numbers(results) == {}
    # The peer really ran: its watchers saw transitions, and a reconnect showed them two frames.
    assert results["peer.notify.p50_ms"] > 0
    assert results["peer.reconnect_flicker_frames"] > 0 and results["reconnect_flicker_frames"] == 0
    assert results["peer.ghost_seconds"] > 0
    report = (tmp_path / "latest.md").read_text()
    assert "| online seen by a watcher, p50 ms" in report
