"""`python -m relay.serve`: Daphne's own command line, with a deep listen queue and a quiet access log."""

import gc
import logging
import subprocess
import sys
import weakref

from twisted.internet.task import Clock

from relay.serve import FULL_COLLECTION_S, LISTEN_BACKLOG, collect_garbage_every, daphne_arguments
from relay.transport.daphne_server import lean_log_records


def test_a_bind_and_port_become_daphnes_endpoint_with_a_deep_listen_queue():
    assert LISTEN_BACKLOG == 1024
    assert daphne_arguments(["-b", "0.0.0.0", "-p", "8001", "relay.asgi:application"]) == [
        "-e",
        "tcp:port=8001:interface=0.0.0.0:backlog=1024",
        "--verbosity",
        "0",
        "relay.asgi:application",
    ]
    # Daphne's own defaults fill a missing half, and its own escaping keeps an IPv6 address whole.
    assert daphne_arguments(["--port", "9", "x:app"])[:2] == ["-e", "tcp:port=9:interface=127.0.0.1:backlog=1024"]
    assert daphne_arguments(["x:app"])[:2] == ["-e", "tcp:port=8000:interface=127.0.0.1:backlog=1024"]
    assert daphne_arguments(["-b", "[::1]", "-p", "9", "x:app"])[1] == r"tcp:port=9:interface=\:\:1:backlog=1024"
    assert daphne_arguments(["-u", "/run/relay.sock", "x:app"])[:2] == ["-e", "unix:/run/relay.sock:backlog=1024"]


def test_endpoints_given_as_descriptions_are_the_callers_own():
    assert daphne_arguments(["-e", "ssl:443:privateKey=k.pem", "x:app"]) == [
        "-e",
        "ssl:443:privateKey=k.pem",
        "--verbosity",
        "0",
        "x:app",
    ]


def test_daphne_runs_quiet_unless_a_verbosity_is_asked_for():
    assert daphne_arguments(["-p", "8000", "x:app"])[2:] == ["--verbosity", "0", "x:app"]
    assert daphne_arguments(["-v", "1", "--access-log", "-", "x:app"])[2:] == [
        "--verbosity",
        "1",
        "--access-log",
        "-",
        "x:app",
    ]
    assert daphne_arguments(["--verbosity=2", "x:app"])[2:4] == ["--verbosity", "2"]


def test_relay_serve_leaves_out_of_log_records_what_no_formatter_shows(monkeypatch):
    for switch in ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile"):
        monkeypatch.setattr(logging, switch, getattr(logging, switch))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("relay.tests.lean")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    monkeypatch.setattr(logger, "propagate", False)
    try:
        logger.info("before")
        lean_log_records()
        logger.info("after")
    finally:
        logger.removeHandler(handler)
    before, after = records
    assert (before.funcName, before.threadName) == (
        "test_relay_serve_leaves_out_of_log_records_what_no_formatter_shows",
        "MainThread",
    )
    assert (after.funcName, after.threadName, after.processName) == ("(unknown function)", None, None)


class Cycle:
    """What a closed connection leaves: objects that refer to each other and nothing else to them."""

    def __init__(self) -> None:
        self.parts = [self, {"owner": self}]


def test_a_closed_connections_cycle_is_freed_at_the_next_full_collection_and_not_before():
    clock = Clock()
    gc.disable()  # no collection of the test's own making: only the timer's
    try:
        collector = collect_garbage_every(FULL_COLLECTION_S, clock)
        freed: list[bool] = []
        weakref.finalize(Cycle(), freed.append, True)
        clock.advance(FULL_COLLECTION_S - 1)
        assert freed == []
        clock.advance(1)
        assert freed == [True]
        collector.stop()
    finally:
        gc.enable()


def test_a_collection_hands_back_the_pages_of_a_fragmented_heap():
    # 1 KB buffers, one in 50 kept: the freed ones lie between live ones, so the heap cannot
    # shrink from its top, and only the trim returns their pages.
    script = (
        "import gc, sys; from relay.serve import collect_garbage;"
        "rss = lambda: next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS'));"
        "gc.disable(); kept, freed = [], [];"
        "[(kept if i % 50 == 0 else freed).append(bytearray(1000)) for i in range(200_000)];"
        "freed.clear(); gc.collect(); before = rss(); collect_garbage(); print(before, rss())"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    before, after = (int(kb) for kb in run.stdout.split())
    assert before > 150_000  # the freed buffers' pages were still held
    assert after < before - 100_000


def test_the_collector_runs_on_daphnes_reactor_installed_on_uvloop():
    # Made on any other reactor, the timer would never fire: Daphne replaces that reactor.
    script = (
        "import asyncio, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy());"
        "from relay.serve import collect_garbage_every; call = collect_garbage_every(60);"
        "from twisted.internet import reactor; import daphne.server;"
        "print(type(call.clock).__name__, call.clock is reactor, type(daphne.server.twisted_loop).__module__)"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["AsyncioSelectorReactor", "True", "uvloop"]
    assert "already installed" not in run.stderr
