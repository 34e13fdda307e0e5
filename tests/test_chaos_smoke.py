"""The chaos run at smoke size, so `make chaos` cannot rot: real instances, real faults, a clean history.

`python -m chaos` with a fixed seed, 60 users and about half a minute of operations and faults,
then its quiet phase and the check. Zero violations counts only beside the proof that the run did
something: connections, resumes, presence frames, messages, membership changes, and faults.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BASE_DIR

pytestmark = [pytest.mark.live, pytest.mark.heavy]

SEED = 11


def test_a_short_chaos_run_is_clean_and_busy(tmp_path: Path):
    results = tmp_path / "chaos.json"
    size = ["--minutes", "0.4", "--users", "60"]
    run = subprocess.run(
        [sys.executable, "-m", "chaos", "--seed", str(SEED), *size, "--out", str(tmp_path), "--results", str(results)],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = json.loads(results.read_text())

    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert summary["violations"] == 0
    assert summary["seeds"] == [SEED]
    operations = summary["operations"]
    assert operations["acked_connects"] >= 60
    assert operations["resumes"] > 0
    assert operations["closes_by_client"] > 0
    assert operations["presence_frames"] > 0
    assert operations["messages_acked"] > 0
    assert operations["messages_received"] > operations["messages_acked"]
    assert operations["membership_changes"] > 0
    assert sum(summary["faults"].values()) > 0
    assert all(count > 0 for count in summary["invariants_checked"].values()), summary["invariants_checked"]
    assert (tmp_path / str(SEED) / "history.jsonl").stat().st_size > 0
