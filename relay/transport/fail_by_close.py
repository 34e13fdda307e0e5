"""Refuse a frame over Daphne's size limits with a close frame (1009), not a dropped connection.

Daphne gives autobahn a 1 MiB limit per message and per frame, in bytes. autobahn checks it on a
frame's header, before reading the payload, and then "fails" the connection, by default by
resetting the TCP connection at once (its `failByDrop` option): the client sees 1006, the same as
a crash or a network fault, and cannot tell that its frame was too big. With `failByDrop` off,
autobahn sends a close frame with the code instead (1009 here; 1002 for a protocol violation) and
discards the rest of the offending frame as it arrives, without buffering it; a peer that never
answers the close is dropped after the close handshake's timeout (relay/close_handshake.py).

Daphne builds its WebSocket factory itself and sets no such option, so it is set when the factory
is built, as relay/close_handshake.py sets the close handshake's timeout. Written for Daphne
4.1-4.2 (`daphne.ws_protocol.WebSocketFactory`) and autobahn's `failByDrop` protocol option
(autobahn 22.4-26; requirements.txt pins both); tests/test_frame_size.py guards it.
"""

import sys


def install() -> None:
    """Make Daphne's WebSocket factory fail connections with a close frame; only in a Daphne process."""
    if "daphne.server" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketFactory

    build = WebSocketFactory.__init__
    if getattr(build, "relay_fail_by_close", False):
        return

    def fail_by_close(self: WebSocketFactory, *args: object, **kwargs: object) -> None:
        build(self, *args, **kwargs)
        # Daphne's own setProtocolOptions call after this leaves the option alone.
        self.setProtocolOptions(failByDrop=False)

    fail_by_close.relay_fail_by_close = True
    WebSocketFactory.__init__ = fail_by_close
