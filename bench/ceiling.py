"""The ceiling baseline: a minimal asyncio `websockets` server pushing presence frames.

Watchers connect to `/v1/ws` and get a `connection.ack`; a message on `/control`
(`{"frames": K}`) makes the server push K `presence.changed` frames to every watcher
as fast as it can. Nothing else: no auth, no Redis, no Django. This is the most a
single Python process on this machine can deliver, the yardstick for Relay's fan-out.
"""

import asyncio
import json
import resource
import sys

from websockets.asyncio.server import ServerConnection, broadcast, serve

watchers: set[ServerConnection] = set()


async def handler(ws: ServerConnection) -> None:
    if ws.request.path.startswith("/control"):
        async for raw in ws:
            count = json.loads(raw)["frames"]
            for index in range(count):
                frame = json.dumps({"type": "presence.changed", "payload": {"user": f"u{index}", "state": "online"}})
                broadcast(watchers, frame)
                # Yield so the writes drain, as a server handling other work would.
                await asyncio.sleep(0)
        return
    watchers.add(ws)
    try:
        await ws.send(json.dumps({"type": "connection.ack", "payload": {}}))
        await ws.wait_closed()
    finally:
        watchers.discard(ws)


async def main(port: int) -> None:
    async with serve(handler, "127.0.0.1", port, ping_interval=None, max_queue=None):
        print("ready", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main(int(sys.argv[1])))
