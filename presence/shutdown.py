"""Closing an instance: cancel presence's timers before Daphne stops, so nothing publishes after.

On SIGTERM Daphne stops the Twisted reactor, whose "before shutdown" triggers cancel every
application instance; presence hooks the same phase itself (ProtocolTypeRouter routes no
`lifespan` scope to tell it). The trigger is registered in `ready()`, before Daphne registers
its own, so timers and the refresh task are cancelled before any consumer is: the cancelled
consumers' `closed` hooks then find the service stopped and leave their slots to `close`, which
frees them all at once. Users held here stay online until their keys expire; a surviving
instance's reaper then decides their `offline` (presence/actions.py).
"""

import asyncio
import sys

from presence.actions import running_services


def _close_all() -> object:
    from twisted.internet import defer

    services = running_services()
    for found in services:
        found.stop()
    if not services:
        return None
    # The slots are freed and the clients closed on the reactor's own loop; Twisted waits for it.
    return defer.Deferred.fromFuture(asyncio.ensure_future(asyncio.gather(*(s.close() for s in services))))


def install() -> None:
    """Register `_close_all` with the reactor, when this process has one (Daphne installs it)."""
    if "twisted.internet.reactor" not in sys.modules:
        return
    from twisted.internet import reactor

    reactor.addSystemEventTrigger("before", "shutdown", _close_all)
