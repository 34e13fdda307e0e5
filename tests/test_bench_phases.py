"""The bench's phases table: a phase that fails names its server and why, and the next still runs."""

import asyncio
import sys
from pathlib import Path

import pytest

from bench import loadgen
from bench.harness import MODES, Bench, Phase, Server
from bench.run import PHASES, run_phase
from devtools.embedded_redis import free_port


def bench_on(redis_client, workdir: Path) -> Bench:
    return Bench("smoke", MODES["smoke"], None, workdir, "", redis_client, with_peer=False)  # type: ignore[arg-type]


def dying_server(workdir: Path) -> Server:
    """A child that writes a last word to its log and exits 3, as a crashed instance would."""
    argv = [sys.executable, "-c", "import sys; print('the last line before the crash', flush=True); sys.exit(3)"]
    server = Server("relay-dying", argv, {}, workdir, free_port())
    server.process.wait()
    server.log.close()
    return server


def test_a_failed_phase_names_the_server_its_error_mentions_with_the_end_of_its_log(redis_client, tmp_path):
    def connects_to_a_dead_server(bench: Bench, sizes: object) -> dict:
        server = dying_server(bench.workdir)
        raise RuntimeError(f"loadgen, waiting for 'ready': ws://127.0.0.1:{server.port}/v1/ws: no connection.ack")

    bench = bench_on(redis_client, tmp_path)
    report = run_phase(Phase("doomed", connects_to_a_dead_server), bench)
    assert report is not None
    assert report.startswith("RuntimeError: loadgen, waiting for 'ready'")
    assert "relay-dying (port" in report and "exited with 3" in report
    assert "the last line before the crash" in report
    assert (tmp_path / "relay-dying.log").exists()


def test_a_server_that_died_is_named_even_when_the_error_does_not_mention_it(redis_client, tmp_path):
    def loses_its_server(bench: Bench, sizes: object) -> dict:
        dying_server(bench.workdir)
        raise TimeoutError("nothing arrived")

    report = run_phase(Phase("doomed", loses_its_server), bench_on(redis_client, tmp_path))
    assert report is not None and "relay-dying (port" in report and "exited with 3" in report


def test_the_phases_after_a_failure_run_and_keep_their_results(redis_client, tmp_path):
    def fails(bench: Bench, sizes: object) -> dict:
        raise ValueError("broken")

    def works(bench: Bench, sizes: object) -> dict:
        return {"works.key": sizes}

    bench = bench_on(redis_client, tmp_path)
    reports = [run_phase(phase, bench) for phase in (Phase("fails", fails), Phase("works", works, sizes={"smoke": 7}))]
    assert reports == ["ValueError: broken", None]
    assert bench.results == {"works.key": 7}


def test_every_phase_has_a_unique_name_and_sizes_for_every_mode():
    names = [phase.name for phase in PHASES]
    assert len(names) == len(set(names)) and "fairness" in names
    for phase in PHASES:
        assert phase.sizes is None or set(phase.sizes) == set(MODES), phase.name


async def test_the_load_generator_names_the_server_that_kept_an_ack_without_its_token(monkeypatch):
    class Silent:
        """A connection that was opened and never answered (nor closed)."""

        close_code = None
        close_reason = ""

    monkeypatch.setattr(loadgen, "ACK_SECONDS", 0.01)
    url = "ws://127.0.0.1:41234/v1/ws?token=secret-token"
    with pytest.raises(RuntimeError) as kept:
        await loadgen.until_acked(asyncio.Event(), Silent(), url)
    assert str(kept.value) == "ws://127.0.0.1:41234/v1/ws: no connection.ack within 0.01 s (still open)"
