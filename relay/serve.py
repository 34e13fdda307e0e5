"""`python -m relay.serve [daphne options] relay.asgi:application`: Daphne on uvloop.

Daphne runs Twisted on an asyncio loop it creates at import time with
`asyncio.new_event_loop()`; installing uvloop's policy first makes that loop a uvloop
one, and every coroutine of the application (the consumer, the channel layer, presence)
runs on it. The options are Daphne's own. See docs/performance.md for what it buys.
"""

import asyncio
import sys

import uvloop


def main(argv: list[str] | None = None) -> None:
    """Install uvloop's event loop policy, then hand the command line to Daphne."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # Imported only now: daphne.server builds its loop when it is first imported.
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
