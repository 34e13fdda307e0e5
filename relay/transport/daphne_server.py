"""Daphne's server and command line with an access log that never shows a query string, and lean log records.

- `command_line()`: Daphne's `CommandLineInterface` building a `Server` subclass whose access
  logger (when one is asked for) drops each path's query string. /v1/ws carries the connection
  token in its query string and Daphne's access lines print the whole URI; Daphne has no option
  to leave it out.
- `lean_log_records()`: the standard library's switches for not collecting a record's thread,
  process and source line (the logging HOWTO, "Optimization"); `logging._srcfile` is private
  but documented there as the way to skip the caller lookup.

Written against Daphne 4.1-4.2 (`daphne.cli.CommandLineInterface.server_class`,
`daphne.server.Server`'s `action_logger`) and CPython 3.11-3.13's logging module
(requirements.txt, pyproject.toml). Upstream: none open yet.
Guards: tests/test_transport_guards.py, tests/test_no_tokens_in_logs.py, tests/test_serve.py.
"""

import logging
from collections.abc import Callable
from typing import Any


class WithoutQueryStrings:
    """An access logger (Daphne's `action_logger`) that passes every line on without its query string."""

    def __init__(self, access_log: Callable[[str, str, dict], Any]) -> None:
        self.access_log = access_log

    def __call__(self, protocol: str, action: str, details: dict) -> None:
        path = details.get("path")
        if isinstance(path, str) and "?" in path:
            details = {**details, "path": path.partition("?")[0]}
        self.access_log(protocol, action, details)


def command_line() -> Any:
    """Daphne's command line, its server's access log without query strings.

    Imported only when called: daphne.server builds its event loop (and installs Twisted's
    reactor) when it is first imported, so the caller installs its loop policy first.
    """
    from daphne.cli import CommandLineInterface
    from daphne.server import Server

    class RelayServer(Server):
        """Daphne's server, its access log (when one is asked for) without query strings."""

        def __init__(self, *args: Any, action_logger: Callable | None = None, **kwargs: Any) -> None:
            quiet = None if action_logger is None else WithoutQueryStrings(action_logger)
            super().__init__(*args, action_logger=quiet, **kwargs)

    class RelayCommandLine(CommandLineInterface):
        server_class = RelayServer

    return RelayCommandLine()


def lean_log_records() -> None:
    """Leave out of every log record the thread, process and source line no Relay formatter shows."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None
