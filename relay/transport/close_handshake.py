"""Give a WebSocket peer time to answer Relay's close before the connection is reset.

Daphne's WebSocket server is autobahn's, which waits 1 s for the peer's answer to a close frame
and then resets the TCP connection. A browser answers from the page's own thread, and a page
still loading (a refused token is closed 4401 right after the page opens the socket) or on a
loaded machine can take longer. When the reset reaches the browser before it has handled the
close frame, the page sees 1006 instead of the code Relay sent: it then retries a 4401 it should
have stopped at, or a 4429 at the short back-off (tests/test_browser.py, the busy-page case).

10 s is what the `websockets` library gives a peer (its `close_timeout`): long enough for a live
client however busy, short enough that one which never answers gives its socket back soon.

Written against Daphne 4.1-4.2 and autobahn 26 (requirements.txt): Daphne exposes no option
for autobahn's `closeHandshakeTimeout` (it has one for the opening handshake, django/daphne#121);
an option of its own is worth proposing upstream, and would replace this. Guard:
tests/test_transport_guards.py.
"""

import sys

CLOSE_HANDSHAKE_TIMEOUT_S = 10.0


def install() -> None:
    """Make Daphne's WebSocket factory wait CLOSE_HANDSHAKE_TIMEOUT_S for a peer's close.

    Only in a Daphne process (`daphne`, `relay.serve`): both import Daphne's server before the
    application, and build the factory after it, so it is built with the longer wait. Elsewhere
    (tests, management commands) nothing is imported or changed. Safe to call more than once.
    """
    if "daphne.server" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketFactory

    build = WebSocketFactory.__init__
    if getattr(build, "relay_close_handshake", False):
        return

    def patient_close(self: WebSocketFactory, *args: object, **kwargs: object) -> None:
        build(self, *args, **kwargs)
        # Daphne's own setProtocolOptions call after this leaves the option alone.
        self.setProtocolOptions(closeHandshakeTimeout=CLOSE_HANDSHAKE_TIMEOUT_S)

    patient_close.relay_close_handshake = True
    WebSocketFactory.__init__ = patient_close
