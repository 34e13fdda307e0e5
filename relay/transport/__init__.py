"""Relay's adjustments to the WebSocket server it runs on (Daphne, autobahn, Twisted), each pinned and guarded."""
