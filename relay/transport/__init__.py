"""Every change Relay makes to a third-party library's behaviour, fenced in one package.

Each module names the upstream versions it was written against (requirements.txt pins those
ranges), the upstream issue it relates to, and the guard test that fails as soon as upstream
changes what it relies on (tests/test_transport_guards.py). Nothing outside this package
reaches into another library's internals.

- `pubsub`: channels-redis's pub/sub layer with one subscription per process, confirmed
  subscriptions, a receive loop without a timer, and process-wide delivery hooks.
- `cluster`: the same layer on a Redis Cluster, over sharded pub/sub, with the subscribing
  side redis-py's asyncio cluster client lacks.
- `hiredis`: redis-py's asyncio connections packing commands in C, as its blocking ones do.
- `websocket_options`: autobahn options Daphne does not expose (the close handshake's timeout,
  a close frame rather than a dropped connection for an oversize frame).
- `autobahn_debug`: autobahn's per-connection debug line without its pretty-printed settings.
- `pending_output`: a bound on the output a connection has queued and its client not read.
- `inbound_backpressure`: a bound on the input a connection has queued and its consumer not taken,
  and a socket left unread for as long as its consumer asks (a connection over its frame rate).
- `channels_dispatch`: Channels' consumer dispatch without a database-thread hop per message.
- `daphne_server`: Daphne's server with an access log without query strings, and lean log records.
"""
