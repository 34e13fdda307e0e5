"""`python -m relay.serve [daphne options] relay.asgi:application`: Daphne on uvloop, tuned.

Daphne runs Twisted on an asyncio loop it creates at import time with
`asyncio.new_event_loop()`; installing uvloop's policy first makes that loop a uvloop
one, and every coroutine of the application (the consumer, the channel layer, presence)
runs on it. It also raises the garbage collector's thresholds (with a full collection every 5
minutes, the heap trimmed after each) and the listen backlog and
leaves Daphne's plain-text access log off unless asked for; when it is on, its lines carry no
query string (a connection token travels in /v1/ws's). Every option is Daphne's own.
"""

import argparse
import asyncio
import ctypes
import gc
import sys

import uvloop
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall

from relay.transport.daphne_server import command_line, lean_log_records

# Python's defaults (700, 10, 10) walk every object of every held connection in a full
# collection every 70,000 net allocations: on 10,000 idle connections those pauses were the
# notify latency's 99th percentile.
GC_THRESHOLDS = (50_000, 50, 100)
# But every closed connection leaves cycles (Twisted's protocol, channel and request, autobahn's,
# the consumer's) that outlive the young generations, and at those thresholds a full collection
# almost never comes: under churn an instance grew by about 50 MB an hour. A full collection on a
# timer bounds them; `gc.freeze()` at start-up (relay/asgi.py) keeps it to what serving made.
FULL_COLLECTION_S = 300
# What the collection frees sits among live objects in glibc's heap, which keeps the pages: RSS
# then rose in steps that never came back. malloc_trim hands the free pages back. None where the
# C library has no such call (musl, macOS).
MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)
# Pending connections the kernel queues for accept() (capped by net.core.somaxconn). Twisted's
# default, 50, overflows in a reconnect storm after a deploy: the kernel drops the SYNs beyond
# it and the clients retry after 1 s, then 3 s.
LISTEN_BACKLOG = 1024


def main(argv: list[str] | None = None) -> None:
    """Install uvloop's event loop policy, then hand the command line to Daphne."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    lean_log_records()
    gc.set_threshold(*GC_THRESHOLDS)
    collect_garbage_every(FULL_COLLECTION_S)
    command_line().run(daphne_arguments(sys.argv[1:] if argv is None else argv))


def collect_garbage_every(seconds: float, clock: IReactorTime | None = None) -> LoopingCall:
    """Run a full garbage collection every `seconds` on Daphne's reactor (started with it), or on `clock`."""
    if clock is None:
        # Daphne installs its asyncio reactor as daphne.server is imported: a timer made before
        # would install Twisted's default one, which Daphne then replaces and never runs.
        import daphne.server  # noqa: F401
    call = LoopingCall(collect_garbage)
    if clock is not None:
        call.clock = clock
    call.start(seconds, now=False)
    return call


def collect_garbage() -> None:
    """A full collection, then the heap's free pages handed back to the system."""
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def daphne_arguments(argv: list[str]) -> list[str]:
    """Daphne's command line with a deep listen queue, and verbosity 0 unless one is given.

    `-b/-p` and `-u` become the endpoint descriptions Daphne would build from them, with
    `backlog=LISTEN_BACKLOG` (`-e` strings are the caller's own and kept as they are).

    At Daphne's default verbosity (1) every WebSocket writes two plain-text access lines to stdout
    (`WSCONNECT`, `WSDISCONNECT`), beside Relay's JSON `connection.opened`/`connection.closed`:
    a log that is no longer one JSON object per line. Verbosity only sets that default;
    `--access-log -` (or a file) still turns the lines on.
    """
    from daphne.cli import DEFAULT_HOST, DEFAULT_PORT
    from daphne.endpoints import build_endpoint_description_strings

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("-b", "--bind", dest="host")
    parser.add_argument("-p", "--port", type=int)
    parser.add_argument("-u", "--unix-socket", dest="unix_socket")
    parser.add_argument("-e", "--endpoint", dest="endpoints", action="append", default=[])
    parser.add_argument("--fd", dest="file_descriptor")
    parser.add_argument("-v", "--verbosity")
    given, rest = parser.parse_known_args(argv)
    # Daphne's own defaults for a partial or missing binding.
    if not any([given.host, given.port is not None, given.unix_socket, given.file_descriptor, given.endpoints]):
        given.host, given.port = DEFAULT_HOST, DEFAULT_PORT
    elif given.host and given.port is None:
        given.port = DEFAULT_PORT
    elif given.port is not None and not given.host:
        given.host = DEFAULT_HOST
    listening = build_endpoint_description_strings(host=given.host, port=given.port, unix_socket=given.unix_socket)
    endpoints = [*given.endpoints, *(f"{description}:backlog={LISTEN_BACKLOG}" for description in listening)]
    arguments = [argument for endpoint in endpoints for argument in ("-e", endpoint)]
    if given.file_descriptor is not None:
        arguments += ["--fd", given.file_descriptor]
    arguments += ["--verbosity", given.verbosity or "0"]
    return [*arguments, *rest]


if __name__ == "__main__":
    main()
