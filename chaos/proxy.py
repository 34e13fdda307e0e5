"""A TCP proxy between the instances and Redis that the nemesis tells to delay, drop or cut.

Run as its own process (`python -m chaos.proxy LISTEN_PORT UPSTREAM_PORT`), so the clients'
event loop never adds latency to Redis traffic. It reads one command a line on stdin:

- `pass`: forward at once (the default);
- `delay SECONDS`: hold every chunk that long before forwarding it, in order;
- `drop`: a partition: nothing is forwarded (new connections are accepted and held too) until the
  next `pass`, when everything held is delivered, as TCP's retransmissions would after a short one;
- `cut`: reset every connection open now (new ones are accepted as usual).

It answers each command with `ok` on stdout once it has taken effect. Only loopback is served.
"""

import asyncio
import contextlib
import socket
import struct
import sys

CHUNK = 65536


class Proxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay = 0.0
        self.open = asyncio.Event()
        self.open.set()
        self.writers: set[asyncio.StreamWriter] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.open.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}
        try:
            await asyncio.gather(self.pipe(reader, up_writer), self.pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                self.writers.discard(end)
                end.close()

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # One queue per direction keeps the order while each chunk waits out its own delay.
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    writer.write_eof() if writer.can_write_eof() else writer.close()
                    return
                await asyncio.sleep(max(0.0, due - loop.time()))
                await self.open.wait()
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((loop.time() + self.delay, data))
            queue.put_nowait((loop.time() + self.delay, b""))
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await sender
            writer.close()

    def cut(self) -> None:
        for writer in list(self.writers):
            sock = writer.get_extra_info("socket")
            # SO_LINGER 0: the close is a reset, as a dropped NAT entry or a crashed peer gives.
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self.writers.clear()

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "pass":
            self.delay = 0.0
            self.open.set()
        elif words[0] == "delay":
            self.delay = float(words[1])
        elif words[0] == "drop":
            self.open.clear()
        elif words[0] == "cut":
            self.cut()
        else:
            raise ValueError(f"unknown proxy command {line!r}")


async def main(listen_port: int, upstream_port: int) -> None:
    proxy = Proxy(upstream_port)
    server = await asyncio.start_server(proxy.serve, "127.0.0.1", listen_port)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    print("ok", flush=True)
    async with server:
        while line := await stdin.readline():
            proxy.command(line.decode())
            print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
