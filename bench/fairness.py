"""The `fairness` phase: one user floods an instance from five sockets while another chats on it.

The innocent user connects, sends one message and waits for its ack, `rounds` times, first on a
quiet instance and then beside the flood (each flooding socket sends `message.send` as fast as
its socket takes them and reads what comes back, from a process of its own, so the flood's client
work does not slow the innocent user's client). Reported: the innocent round's p90 with the
flood over without it, how much the instance's peak RSS grew during the flood, and how many
`rate_limited` errors the flooders got.
"""

import asyncio
import multiprocessing
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import websockets

from bench.harness import World, daphne, say

FLOODERS = 5


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def _p90(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


async def _innocent_round(url: str, channel: str) -> float:
    started = time.perf_counter()
    async with websockets.connect(url, open_timeout=60, proxy=None) as ws:
        while orjson.loads(await ws.recv())["type"] != "connection.ack":
            pass
        idem_key = uuid.uuid4().hex
        payload = {"idem_key": idem_key, "channel": channel, "text": "hello"}
        await ws.send(orjson.dumps({"type": "message.send", "payload": payload}).decode())
        while True:
            frame = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            if frame["type"] == "message.ack" and frame["payload"]["idem_key"] == idem_key:
                return time.perf_counter() - started
            if frame["type"] == "error" and frame["payload"]["code"] == "rate_limited":
                raise RuntimeError("the innocent user was rate limited")


async def _rounds(url: str, channel: str, rounds: int) -> list[float]:
    return [await _innocent_round(url, channel) for _ in range(rounds)]


async def _flood(url: str, channel: str, stop: Any, errors: list[int]) -> None:
    async with websockets.connect(url, open_timeout=60, max_queue=None, proxy=None) as ws:

        async def read() -> None:
            async for raw in ws:
                frame = orjson.loads(raw)
                if frame["type"] == "error" and frame["payload"]["code"] == "rate_limited":
                    errors[0] += 1

        reader = asyncio.create_task(read())
        text = "x" * 1024
        while not stop.is_set():
            payload = {"idem_key": uuid.uuid4().hex, "channel": channel, "text": text}
            await ws.send(orjson.dumps({"type": "message.send", "payload": payload}).decode())
        reader.cancel()


def _flooder_process(urls: list[str], channel: str, stop: Any, errors: Any) -> None:
    """The flood, in a process of its own (`stop` and `errors`: a multiprocessing Event and Value)."""
    counted = [0]

    async def run() -> None:
        await asyncio.gather(*(_flood(url, channel, stop, counted) for url in urls), return_exceptions=True)

    asyncio.run(run())
    errors.value = counted[0]


async def _measure(server_pid: int, innocent_url: str, flooder_urls: list[str], channel: str, rounds: int) -> dict:
    quiet = await _rounds(innocent_url, channel, rounds)
    before = _peak_rss_mb(server_pid)
    context = multiprocessing.get_context("spawn")
    stop, errors = context.Event(), context.Value("q", 0)
    flooder = context.Process(target=_flooder_process, args=(flooder_urls, channel, stop, errors))
    flooder.start()
    await asyncio.sleep(1.0)  # the flood under way before the first round
    flooded = await _rounds(innocent_url, channel, rounds)
    stop.set()
    await asyncio.get_running_loop().run_in_executor(None, flooder.join, 60)
    return {
        "fairness.innocent_p90_ratio": round(_p90(flooded) / _p90(quiet), 3),
        "fairness.flooder_rss_growth_mb": round(_peak_rss_mb(server_pid) - before, 1),
        "fairness.rate_limited_errors": errors.value,
        "_fairness.innocent_p90_quiet_ms": round(_p90(quiet) * 1000, 1),
        "_fairness.innocent_p90_flooded_ms": round(_p90(flooded) * 1000, 1),
    }


def phase_fairness(world: World, workdir: Path, rounds: int = 20) -> dict:
    """Five flooding sockets of one user beside an innocent user's connect, send and ack."""
    flooder, innocent = world.users("fairness-flooder", 1)[0], world.users("fairness-innocent", 1)[0]
    channel = world.channel("fairness-room", [flooder, innocent])
    # Room for the flooder's five sockets: the default allows five connections per user.
    server = daphne("relay-fairness", workdir, RELAY_MAX_CONNECTIONS_PER_USER="10")
    try:
        flooder_urls = [server.ws_url(f"token={world.token(flooder)}") for _ in range(FLOODERS)]
        results = asyncio.run(
            _measure(server.pid, server.ws_url(f"token={world.token(innocent)}"), flooder_urls, channel, rounds)
        )
    finally:
        server.stop()
    say(
        f"fairness: innocent p90 {results['_fairness.innocent_p90_flooded_ms']} ms flooded, "
        f"{results['_fairness.innocent_p90_quiet_ms']} ms quiet; RSS +{results['fairness.flooder_rss_growth_mb']} MB; "
        f"{results['fairness.rate_limited_errors']} rate_limited"
    )
    return results
