"""`python -m relay.serve [daphne options] relay.asgi:application`: Daphne on uvloop.

Daphne runs Twisted on an asyncio loop it creates at import time with
`asyncio.new_event_loop()`; installing uvloop's policy first makes that loop a uvloop
one, and every coroutine of the application (the consumer, the channel layer, presence)
runs on it. The options are Daphne's own. See docs/performance.md for what it buys.
"""

import asyncio
import sys

import uvloop


def _quiet_autobahn_debug() -> None:
    # autobahn pretty-prints every connection's ~40 settings for a DEBUG line it builds eagerly,
    # logged or not: 4 % of the event loop's time during a connect burst (docs/performance.md).
    # The line stays, with the settings replaced by a note.
    import autobahn.websocket.protocol

    autobahn.websocket.protocol.pformat = lambda _settings: "(settings not formatted: relay.serve)"


def main(argv: list[str] | None = None) -> None:
    """Install uvloop's event loop policy, then hand the command line to Daphne."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # Imported only now: daphne.server builds its loop (and installs Twisted's reactor) when it is
    # first imported, which must happen before autobahn is imported.
    from daphne.cli import CommandLineInterface

    _quiet_autobahn_debug()

    CommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
