"""`python -m relay.serve [daphne options] relay.asgi:application`: Daphne on uvloop, tuned.

Daphne runs Twisted on an asyncio loop it creates at import time with
`asyncio.new_event_loop()`; installing uvloop's policy first makes that loop a uvloop
one, and every coroutine of the application (the consumer, the channel layer, presence)
runs on it. It also raises the garbage collector's thresholds and the listen backlog and
leaves Daphne's plain-text access log off unless asked for; when it is on, its lines carry no
query string (a connection token travels in /v1/ws's). Every option is Daphne's own.
"""

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Callable
from typing import Any

import uvloop

# Python's defaults (700, 10, 10) walk every object of every held connection in a full
# collection every 70,000 net allocations: on 10,000 idle connections those pauses were the
# notify latency's 99th percentile. Nothing in Relay relies on prompt collection of cycles.
GC_THRESHOLDS = (50_000, 50, 100)
# Pending connections the kernel queues for accept() (capped by net.core.somaxconn). Twisted's
# default, 50, overflows in a reconnect storm after a deploy: the kernel drops the SYNs beyond
# it and the clients retry after 1 s, then 3 s.
LISTEN_BACKLOG = 1024


def _lean_log_records() -> None:
    # Relay's formatters never show a record's thread, process or source line; the logging
    # HOWTO's "Optimization" section names these switches for not collecting them.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None


class WithoutQueryStrings:
    """An access logger (Daphne's `action_logger`) that passes every line on without its query string.

    The query string of /v1/ws holds the connection token, and Daphne's HTTP lines print the whole
    URI; no other path's query is worth a credential in a log file.
    """

    def __init__(self, access_log: Callable[[str, str, dict], Any]) -> None:
        self.access_log = access_log

    def __call__(self, protocol: str, action: str, details: dict) -> None:
        path = details.get("path")
        if isinstance(path, str) and "?" in path:
            details = {**details, "path": path.partition("?")[0]}
        self.access_log(protocol, action, details)


def main(argv: list[str] | None = None) -> None:
    """Install uvloop's event loop policy, then hand the command line to Daphne."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # Imported only now: daphne.server builds its loop (and installs Twisted's reactor) when it is
    # first imported.
    from daphne.cli import CommandLineInterface
    from daphne.server import Server

    class RelayServer(Server):
        """Daphne's server, its access log (when one is asked for) without query strings."""

        def __init__(self, *args: Any, action_logger: Callable | None = None, **kwargs: Any) -> None:
            quiet = None if action_logger is None else WithoutQueryStrings(action_logger)
            super().__init__(*args, action_logger=quiet, **kwargs)

    class RelayCommandLine(CommandLineInterface):
        server_class = RelayServer

    _lean_log_records()
    gc.set_threshold(*GC_THRESHOLDS)
    RelayCommandLine().run(daphne_arguments(sys.argv[1:] if argv is None else argv))


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
