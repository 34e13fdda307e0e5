"""A webhook receiver for the benchmark: `python -m bench.webhook_receiver PORT`.

Answers 200 to every POST, or holds each one (`hang SECONDS`, `gate` until `open`), as the
commands on stdin say; `dump` prints every receipt so far as one JSON line: the event's type,
its `webhook-id`, its timestamp and when it arrived (unix seconds, this machine's clock).
asyncio with hand-parsed HTTP/1.1 keep-alive: a receiver far faster than what it measures.
"""

import asyncio
import contextlib
import json
import sys
import threading
import time
from datetime import datetime

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class Receiver:
    def __init__(self) -> None:
        self.mode = "ok"
        self.hang_seconds = 0.0
        self.gate = asyncio.Event()
        self.receipts: list[tuple[str, str, float, float]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                arrived = time.time()
                event = json.loads(body)
                stamp = datetime.fromisoformat(event["timestamp"]).timestamp()
                self.receipts.append((event["type"], headers.get("webhook-id", ""), stamp, arrived))
                if self.mode == "hang":
                    await asyncio.sleep(self.hang_seconds)
                elif self.mode == "gate":
                    await self.gate.wait()
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "ok":
            self.mode = "ok"
        elif words[0] == "hang":
            self.mode, self.hang_seconds = "hang", float(words[1])
        elif words[0] == "gate":
            self.mode = "gate"
            self.gate.clear()
        elif words[0] == "open":
            self.mode = "ok"
            self.gate.set()
        elif words[0] == "dump":
            print(json.dumps(self.receipts), flush=True)


async def main(port: int) -> None:
    receiver = Receiver()
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(receiver.serve, "127.0.0.1", port, backlog=1024)

    def read_commands() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(receiver.command, line)
        loop.call_soon_threadsafe(server.close)

    threading.Thread(target=read_commands, daemon=True).start()
    print(json.dumps({"listening": port}), flush=True)
    async with server:
        with contextlib.suppress(asyncio.CancelledError):
            await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
