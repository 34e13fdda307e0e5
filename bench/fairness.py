"""`fairness`: one user floods an instance with 5 sockets while another connects, sends and waits.

The innocent user's rounds (connect, `connection.ack`, one `message.send`, its `message.ack`,
close) run first on a quiet instance and then while the flooder's 5 sockets send `message.send`
as fast as they can; the ratio of the two p90s is what the flood costs everyone else. The flood
and the innocent user run in two load-generator processes, so the flood's own client CPU does
not slow the innocent's. The flooder's `error` frames with code `rate_limited` are counted: the
per-connection rate limit is what should keep both the ratio and the instance's memory down.
"""

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

import orjson

from bench.harness import Bench, LoadGen, daphne, peak_rss_kb, rss_kb, run_job, say
from bench.loadgen import ACK_SECONDS, connect, emit, percentile, progress, until_acked, wait_line

FLOOD_SOCKETS = 5


@dataclass(frozen=True)
class FairnessSizes:
    # The innocent user's rounds, without the flood and then with it.
    rounds: int
    # How long the flood runs before the innocent user's rounds under it begin.
    head_start_s: float
    # A round not done in this long failed; it counts as this long (the least it cost the user).
    round_timeout_s: float


SIZES = {
    "full": FairnessSizes(20, 2.0, 10.0),
    "quick": FairnessSizes(20, 1.0, 10.0),
    "smoke": FairnessSizes(3, 0.3, 1.0),
}
TARGETS = {
    "fairness.innocent_p90_ratio": ("<=", 2),
    "fairness.flooder_rss_growth_mb": ("<=", 40),
    "fairness.rate_limited_errors": (">", 0),
}


def run(bench: Bench, sizes: FairnessSizes) -> dict:
    world = bench.world
    flooder, innocent = world.users("fair-flooder", 1)[0], world.users("fair-innocent", 1)[0]
    flood_channel, innocent_channel = world.channel("fair-flood", [flooder]), world.channel("fair-quiet", [innocent])
    server = daphne("relay-fairness", bench.workdir)
    innocent_job = {
        "scenario": "bench.fairness:innocent",
        "name": "quiet",
        "url": server.ws_url(f"token={world.token(innocent)}"),
        "channel": innocent_channel,
        "rounds": sizes.rounds,
        "timeout_s": sizes.round_timeout_s,
    }
    flood = None
    try:
        quiet = run_job(innocent_job)
        rss_before = rss_kb(server.pid)
        flood = LoadGen(
            {
                "scenario": "bench.fairness:flood",
                "urls": [server.ws_url(f"token={world.token(flooder)}") for _ in range(FLOOD_SOCKETS)],
                "channel": flood_channel,
            }
        )
        flood.expect("ready")
        flood.release()
        time.sleep(sizes.head_start_s)
        loud = run_job({**innocent_job, "name": "flooded"})
        flood.release()
        flooded = flood.finish()
        peak = peak_rss_kb(server.pid)
    finally:
        if flood:
            flood.kill()
        server.stop()
    ratio = loud["p90_ms"] / quiet["p90_ms"] if quiet["p90_ms"] else 0.0
    growth_mb = max(0, peak - rss_before) / 1024
    say(
        f"fairness: innocent p90 {quiet['p90_ms']} ms quiet, {loud['p90_ms']} ms under the flood (x{ratio:.2f}, "
        f"{loud['failed']} of {sizes.rounds} rounds failed); "
        f"the flood sent {flooded['sent']} frames in {flooded['seconds']} s, {flooded['rate_limited']} rate_limited, "
        f"{flooded['acks']} acks; RSS +{growth_mb:.1f} MB"
    )
    return {
        "fairness.innocent_p90_ratio": round(ratio, 3),
        "fairness.flooder_rss_growth_mb": round(growth_mb, 1),
        "fairness.rate_limited_errors": flooded["rate_limited"],
        "_fairness_quiet_p90_ms": quiet["p90_ms"],
        "_fairness_flood_p90_ms": loud["p90_ms"],
        "_fairness_quiet_failed_rounds": quiet["failed"],
        "_fairness_flood_failed_rounds": loud["failed"],
        "_fairness_flood_first_failure": loud["first_failure"],
        "_fairness_flood_frames_sent": flooded["sent"],
        "_fairness_flood_frames_per_s": round(flooded["sent"] / flooded["seconds"]) if flooded["seconds"] else 0,
        "_fairness_flood_acks": flooded["acks"],
        "_fairness_flood_other_errors": flooded["other_errors"],
        "_fairness_flood_sockets_closed_by_server": flooded["closed_by_server"],
    }


# ── load-generator scenarios (`python -m bench.loadgen` runs them by name) ─────
async def _round(url: str, channel: str, key: str) -> float:
    """Connect, wait for the ack, send one message, wait for its ack, close: the ms it all took."""
    started = time.perf_counter()
    ws = await connect(url)
    acked = asyncio.Event()
    answered: asyncio.Future = asyncio.get_running_loop().create_future()

    async def read() -> None:
        async for raw in ws:
            frame = orjson.loads(raw)
            if frame["type"] == "connection.ack":
                acked.set()
            elif frame["type"] in ("message.ack", "error") and not answered.done():
                answered.set_result(frame)

    reader = asyncio.create_task(read())
    try:
        await until_acked(acked, ws, url)
        payload = {"channel": channel, "idem_key": key, "text": "hello"}
        await ws.send(orjson.dumps({"type": "message.send", "payload": payload}).decode())
        frame = await asyncio.wait_for(answered, ACK_SECONDS)
        took = (time.perf_counter() - started) * 1000
        if frame["type"] == "error":
            raise RuntimeError(f"the innocent user's send was refused: {frame['payload']}")
        return took
    finally:
        await ws.close()
        reader.cancel()


async def innocent(job: dict) -> None:
    """`rounds` rounds one after the other; their p90 and every round's ms (a failed one: the timeout)."""
    took, failures = [], []
    for n in range(job["rounds"]):
        try:
            one = _round(job["url"], job["channel"], f"{job['name']}-{n}")
            took.append(await asyncio.wait_for(one, job["timeout_s"]))
        except TimeoutError:
            failures.append(f"round {n}: not done within {job['timeout_s']} s")
            took.append(job["timeout_s"] * 1000)
        except RuntimeError as error:
            failures.append(f"round {n}: {error}")
            took.append(job["timeout_s"] * 1000)
    emit(
        "result",
        p90_ms=round(percentile(took, 90), 2),
        ms=[round(ms, 2) for ms in took],
        failed=len(failures),
        first_failure=failures[0] if failures else "",
    )


async def flood(job: dict) -> None:
    """Connect every URL; on the first line, send `message.send` on all of them as fast as they go; stop on the next."""
    sockets = [await connect(url, max_queue=None) for url in job["urls"]]
    counts = {"sent": 0, "acks": 0, "rate_limited": 0, "other_errors": 0, "closed_by_server": 0}
    acked = [asyncio.Event() for _ in sockets]
    stopping = False

    async def read(ws: Any, ack: asyncio.Event) -> None:
        try:
            async for raw in ws:
                frame = orjson.loads(raw)
                kind = frame["type"]
                if kind == "connection.ack":
                    ack.set()
                elif kind == "message.ack":
                    counts["acks"] += 1
                elif kind == "error":
                    code = frame["payload"].get("code")
                    counts["rate_limited" if code == "rate_limited" else "other_errors"] += 1
        finally:
            if not stopping:
                counts["closed_by_server"] += 1

    readers = [asyncio.create_task(read(ws, ack)) for ws, ack in zip(sockets, acked, strict=True)]
    for ws, ack, url in zip(sockets, acked, job["urls"], strict=True):
        await until_acked(ack, ws, url)
    emit("ready")
    await wait_line()
    keys = itertools.count()

    async def send(index: int, ws: Any) -> None:
        while True:
            payload = {"channel": job["channel"], "idem_key": f"f{index}-{next(keys)}", "text": "flood"}
            await ws.send(orjson.dumps({"type": "message.send", "payload": payload}).decode())
            counts["sent"] += 1
            if counts["sent"] % 50 == 0:
                await asyncio.sleep(0)  # the readers get their turn

    started = time.perf_counter()
    senders = [asyncio.create_task(send(index, ws)) for index, ws in enumerate(sockets)]
    await wait_line()
    seconds = time.perf_counter() - started
    stopping = True
    for task in senders:
        task.cancel()
    await asyncio.gather(*senders, return_exceptions=True)
    progress(f"flood: {counts['sent']} frames in {seconds:.1f} s, {counts['rate_limited']} rate_limited")
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    await asyncio.gather(*readers, return_exceptions=True)
    emit("result", seconds=round(seconds, 2), **counts)
