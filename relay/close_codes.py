"""The WebSocket close codes Relay sends, and what each tells a client (docs/contract.md, WebSocket).

A client stops reconnecting at 4401 and 4429, and reconnects (with back-off) after the others.
"""

# The token is missing, forged, expired or of another tenant, or its secret was rotated away.
UNAUTHORIZED = 4401
# The user already holds RELAY_MAX_CONNECTIONS_PER_USER connections.
TOO_MANY_CONNECTIONS = 4429
# The client read too slowly: its unsent output passed RELAY_MAX_PENDING_BYTES
# (relay/transport/pending_output.py).
SLOW_READER = 4008
# A resume's backfill failed: the client reconnects with its cursor, which beats holding the
# channel's live messages forever or releasing them over a gap.
RESUME_FAILED = 1011
# A frame over the size Daphne accepts (1 MiB); Daphne sends it, Relay only names it.
MESSAGE_TOO_BIG = 1009
