"""What one presence transition and one online user cost Redis (docs/scaling.md).

    .venv/bin/python scripts/measure_presence_redis.py

Runs the real presence scripts (presence/scripts.py, through presence/store.py) against a private
embedded redis-server and reads Redis's own counters: INFO commandstats (commands run), INFO stats
(bytes in and out), INFO memory (used_memory) and MEMORY USAGE (per key).
"""

import asyncio
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")

import django

django.setup()

import redis  # noqa: E402

from devtools.embedded_redis import EmbeddedRedis  # noqa: E402
from presence.scripts import channels_key, connections_key, presence_key  # noqa: E402
from presence.store import PresenceStore, Timings  # noqa: E402

USERS = 10_000
CHANNELS = 10
TIMINGS = Timings(grace=30_000, ttl=30_000, refresh=10_000, margin=1_000, max_connections=5)


def counters(client: redis.Redis) -> tuple[int, int, int]:
    calls = sum(stat["calls"] for stat in client.info("commandstats").values())
    stats = client.info("stats")
    return calls, stats["total_net_input_bytes"], stats["total_net_output_bytes"]


async def main() -> None:
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        store = PresenceStore(server.url, TIMINGS)
        env = str(uuid.uuid4())
        channels = [str(uuid.uuid4()) for _ in range(CHANNELS)]
        prefix = "relay__group__presence."
        payload = b"x" * 150  # a transition as msgpack is about this size
        publish = [(prefix + channel, payload) for channel in channels]
        # Loaded once, so the measured calls do not carry the scripts' text.
        epoch = await store.release(env, "warm", "c", last_local=True)
        await store.elect(env, "warm", "c")
        await store.grace_check(env, "warm", epoch)
        await store.refresh([(f"{env}:warm", None, ["c"])])
        await store.reap()
        # One connect that wins the election, one last close and its grace check: a user's life.
        client.config_resetstat()
        first, second = counters(client), counters(client)
        # What reading the counters itself costs (the INFO calls and their replies).
        cost = [b - a for a, b in zip(first, second, strict=True)]
        before = counters(client)
        await store.elect(env, "u-0", "c-0", publish=publish, channels=channels)
        admitted = counters(client)
        epoch = await store.release(env, "u-0", "c-0", last_local=True)
        client.delete(presence_key(env, "u-0"))  # the grace has passed
        released = counters(client)
        await store.grace_check(env, "u-0", epoch, publish)
        checked = counters(client)
        for name, start, end in (
            ("online (ADMIT)", before, admitted),
            ("close (RELEASE)", admitted, released),
            ("offline (GRACE_CHECK)", released, checked),
        ):
            spent = [e - s - c for s, e, c in zip(start, end, cost, strict=True)]
            print(f"{name}: commands {spent[0]}, bytes in {spent[1]}, out {spent[2]}")
        # Memory per online user, each in CHANNELS channels.
        client.flushall()
        base = client.info("memory")["used_memory"]
        # A few hundred connects at a time, as they reach an instance: one gather of all of them
        # would queue past the store's fail-fast timeout on a busy machine.
        for start in range(0, USERS, 500):
            users = range(start, min(start + 500, USERS))
            await asyncio.gather(*(store.elect(env, f"user-{i}", f"conn-{i}", channels=channels) for i in users))
        used = client.info("memory")["used_memory"] - base
        keys = {
            "presence": presence_key(env, "user-1"),
            "conns": connections_key(env, "user-1"),
            "channels": channels_key(env, "user-1"),
        }
        per_key = {kind: client.memory_usage(key) for kind, key in keys.items()}
        print(f"memory per online user in {CHANNELS} channels: {used // USERS} bytes (used_memory); keys {per_key}")
        # The refresh of all of them, one script per bucket per instance per interval.
        start = counters(client)
        await store.refresh([(f"{env}:user-{i}", None, [f"conn-{i}"]) for i in range(USERS)])
        end = counters(client)
        print(f"refresh of {USERS} users: commands {end[0] - start[0] - 1}, bytes in {end[1] - start[1]}")
        # A reaper pass with nothing due, as every instance runs one per interval.
        start = counters(client)
        await store.reap()
        end = counters(client)
        print(f"reaper pass, nothing due: commands {end[0] - start[0] - 1}, bytes in {end[1] - start[1]}")
        await store.close()
        client.close()


asyncio.run(main())
