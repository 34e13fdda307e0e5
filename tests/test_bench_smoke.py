"""The benchmark's smoke run, so `make bench` cannot rot: every phase runs and every key is a number.

Timings are not asserted (the suite runs on a shared 2-core machine); the full and quick runs
and their targets are `make bench` / `make bench-quick` (docs/performance.md).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import BASE_DIR

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
}


@pytest.mark.bench
def test_the_smoke_benchmark_writes_every_key_as_a_number(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(tmp_path)],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "latest.json").read_text())
    assert set(results) == KEYS
    not_numbers = {
        key: value for key, value in results.items() if isinstance(value, bool) or not isinstance(value, int | float)
    }
    assert not_numbers == {}
    # The smoke run really connected: a harness that silently measured nothing would pass the above.
    assert results["idle.connections"] > 0
    assert results["redis.commands_per_connect"] > 0
    report = (tmp_path / "latest.md").read_text()
    assert "## Machine" in report and "## Versions" in report and "## Settings" in report
    # Counted under callgrind, or said why not (valgrind is optional).
    assert "| connect_instructions_ratio |" in report or "| connect_instructions | skipped" in report
    assert not (tmp_path / "latest.json").samefile(BASE_DIR / "bench" / "results" / "latest.json")
