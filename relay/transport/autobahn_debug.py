"""autobahn's per-connection debug line, built without pretty-printing its settings.

autobahn logs every new connection's ~40 protocol settings at DEBUG, and builds the line's
argument with `pprint.pformat` whether or not DEBUG is on. That pretty-printing measured
≈ 1.4 M instructions of a connect's ≈ 3.8 M in a bare Channels consumer on Daphne, the biggest
single cost of a connect (even `repr` of the same list cost ≈ 0.3 M). autobahn looks `pformat`
up in its module when it logs, so that name is pointed at a function that answers a placeholder:
the debug line stays, without the settings. (Its other debug arguments, `hltype`/`hlval`, cost
too little to touch.)

Written against autobahn 26 (requirements.txt): `autobahn.websocket.protocol` imports `pformat`
from pprint and calls it in `WebSocketProtocol._connectionMade`. Upstream: no issue open yet;
autobahn-python should build debug arguments only when DEBUG is enabled (txaio's logger can
tell). Guard: tests/test_transport_guards.py.
"""

import sys

NOT_FORMATTED = "(settings not formatted: relay/transport/autobahn_debug.py)"


def install() -> None:
    """Make autobahn skip formatting its per-connection settings; only in a Daphne process."""
    if "daphne.server" not in sys.modules:
        return
    import autobahn.websocket.protocol

    autobahn.websocket.protocol.pformat = _not_formatted


def _not_formatted(_value: object) -> str:
    return NOT_FORMATTED
