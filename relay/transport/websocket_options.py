"""autobahn protocol options Daphne does not expose, set on the WebSocket factory it builds.

Daphne builds its WebSocket factory itself and passes autobahn only a few options; these two it
leaves at autobahn's defaults, which do not suit Relay:

- `closeHandshakeTimeout` 10 s, not 1 s. autobahn waits that long for the peer's answer to a
  close frame, then resets the TCP connection. A browser answers from the page's own thread, and a
  page still loading (a refused token is closed 4401 right after the page opens the socket) or on
  a loaded machine can take longer; when the reset reaches it first, the page sees 1006 instead
  of the code Relay sent, and retries a 4401 it should have stopped at, or a 4429 at the short
  back-off (tests/test_browser.py, the busy-page case). 10 s is what the `websockets` library
  gives a peer: long enough for a live client however busy, short enough that one which never
  answers gives its socket back soon.
- `failByDrop` off. On a frame over Daphne's 1 MiB limits (checked on the frame's header, before
  the payload is read) autobahn "fails" the connection, by default by resetting it at once: the
  client sees 1006, as for a crash, and cannot tell its frame was too big. With it off autobahn
  sends a close frame with the code (1009; 1002 for a protocol violation) and discards the rest of
  the offending frame as it arrives, without buffering it.

Written against Daphne 4.1-4.2 (`daphne.ws_protocol.WebSocketFactory`) and autobahn 26
(requirements.txt pins both). Upstream: Daphne has an option for the opening handshake's timeout
(django/daphne#121) but none for these; options of its own are worth proposing, and would
replace this module. Guards: tests/test_transport_guards.py, tests/test_frame_size.py.
"""

import sys

CLOSE_HANDSHAKE_TIMEOUT_S = 10.0
OPTIONS = {"closeHandshakeTimeout": CLOSE_HANDSHAKE_TIMEOUT_S, "failByDrop": False}


def install() -> None:
    """Make Daphne's WebSocket factory start with `OPTIONS`.

    Only in a Daphne process (`daphne`, `relay.serve`): both import Daphne's server before the
    application, and build the factory after it. Elsewhere (tests, management commands) nothing
    is imported or changed. Safe to call more than once.
    """
    if "daphne.server" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketFactory

    build = WebSocketFactory.__init__
    if getattr(build, "relay_options", False):
        return

    def with_relay_options(self: WebSocketFactory, *args: object, **kwargs: object) -> None:
        build(self, *args, **kwargs)
        # Daphne's own setProtocolOptions call after this names neither option, and leaves them.
        self.setProtocolOptions(**OPTIONS)

    with_relay_options.relay_options = True
    WebSocketFactory.__init__ = with_relay_options
