"""`python -m relay.serve [daphne options] relay.asgi:application`: Daphne on uvloop, tuned.

Daphne runs Twisted on an asyncio loop it creates at import time with
`asyncio.new_event_loop()`; installing uvloop's policy first makes that loop a uvloop
one, and every coroutine of the application (the consumer, the channel layer, presence)
runs on it. It also raises the garbage collector's thresholds and the listen backlog, skips
debug-only costs of autobahn's and leaves Daphne's plain-text access log off unless asked
for. The options are Daphne's own. See docs/performance.md for what each buys.
"""

import asyncio
import gc
import logging
import sys

import uvloop

# Python's defaults (700, 10, 10) collect the young generation every 700 net allocations and
# consider a full collection, which walks every object of every held connection, every 100 young
# ones. On the benchmark those passes were notify's p99 (78-104 ms -> 26-27 ms with these) and
# ~10 % of a connect's CPU. Nothing in Relay relies on prompt collection of cycles; reference
# counting still frees everything else at once.
GC_THRESHOLDS = (50_000, 50, 100)
# Pending connections the kernel queues for accept() (capped by net.core.somaxconn). Twisted's
# default, 50, overflowed in a burst of connects (a reconnect storm after a deploy, the churn
# benchmark from 300 connects/s): the kernel drops the SYNs beyond it and clients retry after
# 1 s, then 3 s, which was the whole of the churn phase's p99.
LISTEN_BACKLOG = 1024


def _quiet_autobahn_debug() -> None:
    # autobahn pretty-prints every connection's ~40 settings for a DEBUG line it builds eagerly,
    # logged or not: 4 % of the event loop's time during a connect burst (docs/performance.md).
    # The line stays, with the settings replaced by a note.
    import autobahn.twisted.websocket
    import autobahn.util
    import autobahn.websocket.protocol

    autobahn.websocket.protocol.pformat = lambda _settings: "(settings not formatted: relay.serve)"
    # The same for the arguments of its per-frame debug lines (every sendData: four click.style()
    # calls for terminal colours): autobahn's own plain-text path, as if click were not installed.
    autobahn.util._HAS_CLICK = False
    # And the rest of those arguments, built per frame sent or read and per connection whatever
    # the level: a method's qualified name taken apart and joined again (hltype), a value turned
    # into text (hlval). A debug line, if enabled, shows the method and the value themselves.
    for module in (autobahn.websocket.protocol, autobahn.twisted.websocket):
        module.hltype = module.hlval = _unformatted


def _unformatted(value: object, *_style: object, **_styles: object) -> object:
    return value


def _deep_listen_queue() -> None:
    # Daphne builds its `-b/-p` and `-u` endpoints without a backlog; `-e` strings are the user's own.
    import daphne.cli
    from daphne.endpoints import build_endpoint_description_strings

    def with_backlog(*args: object, **kwargs: object) -> list[str]:
        return [
            f"{description}:backlog={LISTEN_BACKLOG}" if description.startswith(("tcp:", "unix:")) else description
            for description in build_endpoint_description_strings(*args, **kwargs)
        ]

    daphne.cli.build_endpoint_description_strings = with_backlog


def _lean_log_records() -> None:
    # Relay's formatters never show a record's thread, process or source line; collecting the
    # first two (names, ids, multiprocessing lookups) was a third of a log record's cost, and the
    # source line (a walk up the stack, ≈ 2 µs) a sixth of what is left, two records per connect.
    # `_srcfile = None` is the logging HOWTO's own switch for the source line ("Optimization").
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None


def main(argv: list[str] | None = None) -> None:
    """Install uvloop's event loop policy, then hand the command line to Daphne."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # Imported only now: daphne.server builds its loop (and installs Twisted's reactor) when it is
    # first imported, which must happen before autobahn is imported.
    from daphne.cli import CommandLineInterface

    _quiet_autobahn_debug()
    _deep_listen_queue()
    _lean_log_records()
    gc.set_threshold(*GC_THRESHOLDS)

    CommandLineInterface().run(daphne_arguments(sys.argv[1:] if argv is None else argv))


def daphne_arguments(argv: list[str]) -> list[str]:
    """Daphne's command line, verbosity 0 unless one is given.

    At Daphne's default verbosity (1) every WebSocket writes two plain-text access lines to stdout
    (`WSCONNECT`, `WSDISCONNECT`), beside Relay's JSON `connection.opened`/`connection.closed`:
    a log that is no longer one JSON object per line, and two more writes per connection.
    Verbosity only sets that default; `--access-log -` (or a file) still turns the lines on.
    """
    if any(arg in ("-v", "--verbosity") or arg.startswith("--verbosity=") for arg in argv):
        return argv
    return ["--verbosity", "0", *argv]


if __name__ == "__main__":
    main()
