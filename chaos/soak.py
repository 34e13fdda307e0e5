"""`make soak`: steady churn and messages against two instances, sampled until growth shows or does not.

The chaos run's clients and membership changes (chaos/clients.py) without the nemesis, and,
when the server speaks it (its frame schema lists `presence.set`), status changes. Every
sample takes each instance's RSS and open file descriptors, Redis's key count and used memory,
and the row count of every database table. After the warm-up (the first 10 minutes, or a third
of a shorter run) it judges:

- `soak.rss_slope_mb_per_h`: the steepest instance's least-squares RSS slope (target <= 5);
- `soak.fd_growth`: open descriptors less the instance's clients of the moment, the second half's
  median over the first half's highest, summed over instances (target 0);
- `soak.redis_keys_growth`: the same for Redis's keys less the users connected at each sample,
  so that churn moving users on and off line is not counted as growth (target 0).

Writes `soak-latest.json`, `soak-latest.csv` and `soak-latest.png` (matplotlib) under `--out`.
"""

import argparse
import asyncio
import csv
import json
import os
import random
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from chaos.__main__ import prepare_environment

if TYPE_CHECKING:  # imported for real once the environment is prepared (they load Django)
    from chaos.clients import Population
    from chaos.deploy import Deployment, Tenant

TARGETS = {"soak.rss_slope_mb_per_h": 5.0, "soak.fd_growth": 0, "soak.redis_keys_growth": 0}
WARMUP_MINUTES = 10.0
STATUSES = ("available", "away", "busy", "dnd")


def slope_per_hour(times_s: list[float], values: list[float]) -> float:
    """The least-squares slope of `values` over `times_s`, per hour."""
    if len(times_s) < 2:
        return 0.0
    mean_t, mean_v = statistics.fmean(times_s), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times_s)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in zip(times_s, values, strict=True)) / spread * 3600


def growth(values: list[float]) -> float:
    """How far the second half's median rose above the first half's highest (0 when it did not)."""
    if len(values) < 2:
        return 0.0
    half = len(values) // 2
    return max(0.0, statistics.median(values[half:]) - max(values[:half]))


def judge(samples: list[dict], warmup_s: float) -> dict:
    """The soak's figures from its samples, and whether each meets its target."""
    steady = [sample for sample in samples if sample["t"] >= warmup_s] or samples
    instances = sorted({key.split(".")[1] for key in samples[0] if key.startswith("rss_mb.")})
    times = [sample["t"] for sample in steady]
    figures = {
        "soak.rss_slope_mb_per_h": round(
            max(slope_per_hour(times, [sample[f"rss_mb.{name}"] for sample in steady]) for name in instances), 2
        ),
        # Each client holds one socket: what grows beyond the clients of the moment is a leak.
        "soak.fd_growth": round(
            sum(growth([sample[f"fds.{name}"] - sample[f"clients.{name}"] for sample in steady]) for name in instances)
        ),
        "soak.redis_keys_growth": round(growth([sample["redis_keys"] - sample["live_users"] for sample in steady])),
    }
    figures["passed"] = all(figures[key] <= target for key, target in TARGETS.items())
    return figures


def table_counts(database: str) -> dict[str, int]:
    """Rows per table of the run's database."""
    if database.startswith("sqlite:///"):
        with sqlite3.connect(database.removeprefix("sqlite:///")) as connection:
            names = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {name: connection.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in names}
    import psycopg

    with psycopg.connect(database) as connection:
        names = [
            row[0]
            for row in connection.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        ]
        return {name: connection.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in names}


def sample(t: float, deployment: "Deployment", population: "Population") -> dict:
    import redis

    from bench.harness import rss_kb

    row: dict = {"t": round(t, 1)}
    for instance in deployment.serving():
        pid = instance.process.pid
        row[f"rss_mb.{instance.name}"] = round(rss_kb(pid) / 1024, 2)
        row[f"fds.{instance.name}"] = len(os.listdir(f"/proc/{pid}/fd"))
        row[f"clients.{instance.name}"] = sum(
            1 for slot in population.slots if slot.ws is not None and slot.instance == instance.name
        )
    client = redis.Redis.from_url(deployment.redis.url)
    try:
        row["redis_keys"] = client.dbsize()
        row["redis_used_mb"] = round(client.info("memory")["used_memory"] / 2**20, 2)
    finally:
        client.close()
    row["live_users"] = len({slot.name for slot in population.slots if slot.ws is not None})
    for table, count in table_counts(deployment.database).items():
        row[f"rows.{table}"] = count
    return row


async def change_statuses(population: "Population", seed: int) -> int:
    """Send `presence.set` from a random connected client, twice a second; return how many were sent."""
    rng = random.Random(f"{seed}:statuses")
    sent = 0
    while not population.quiet.is_set():
        await asyncio.sleep(0.5)
        connected = [slot for slot in population.slots if slot.ws is not None]
        if not connected:
            continue
        slot = rng.choice(connected)
        frame = {"type": "presence.set", "payload": {"status": rng.choice(STATUSES)}}
        try:
            await slot.ws.send(json.dumps(frame))
            sent += 1
        except Exception:  # the socket closed meanwhile: the next one will do
            continue
    return sent


async def soak(
    seed: int, minutes: float, every_s: float, deployment: "Deployment", tenants: "list[Tenant]"
) -> tuple[list, dict]:
    from chaos.clients import Population
    from chaos.history import HistoryWriter

    # The soak judges resources, not the history: its records go nowhere.
    population = Population(seed, deployment, tenants, HistoryWriter(Path(os.devnull)))
    tasks = [asyncio.create_task(slot.run()) for slot in population.slots]
    tasks.append(asyncio.create_task(population.change_memberships()))
    _, schema = deployment.api("GET", "/v1/schema/frames.json")
    speaks_status = "presence.set" in (schema or {}).get("$defs", {})
    statuses = asyncio.create_task(change_statuses(population, seed)) if speaks_status else None
    samples = []
    started = time.monotonic()
    deadline = started + minutes * 60
    while True:
        samples.append(await asyncio.to_thread(sample, time.monotonic() - started, deployment, population))
        print(f"soak: {json.dumps(samples[-1])}", file=sys.stderr, flush=True)
        if time.monotonic() + every_s > deadline + 1:
            break
        await asyncio.sleep(max(0.0, started + len(samples) * every_s - time.monotonic()))
    population.quiet.set()
    await asyncio.gather(*tasks)
    sent = await statuses if statuses else None
    await population.close_all()
    return samples, {"status_changes": sent, "users": sum(len(t.users) for t in tenants)}


def plot(samples: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    minutes = [row["t"] / 60 for row in samples]
    panels = [
        ("RSS (MB)", [key for key in samples[0] if key.startswith("rss_mb.")]),
        ("open file descriptors", [key for key in samples[0] if key.startswith("fds.")]),
        ("Redis keys, live users", ["redis_keys", "live_users"]),
        ("Redis used memory (MB)", ["redis_used_mb"]),
        ("database rows", [key for key in samples[0] if key.startswith("rows.") and samples[-1][key] > 0]),
    ]
    figure, axes = pyplot.subplots(len(panels), 1, figsize=(9, 2.4 * len(panels)), sharex=True)
    for axis, (title, keys) in zip(axes, panels, strict=True):
        for key in keys:
            axis.plot(minutes, [row.get(key, 0) for row in samples], label=key.split(".", 1)[-1])
        axis.set_title(title, fontsize=9)
        axis.legend(fontsize=6, loc="upper left", ncol=3)
        axis.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--sample-seconds", type=float, default=60.0, help="how often to sample (default 60)")
    parser.add_argument("--users", type=int, default=100, help="simulated users over both tenants")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="where soak-latest.* go (default bench/results)")
    args = parser.parse_args(argv)
    prepare_environment()
    from chaos.deploy import Deployment
    from chaos.run import RESULTS

    out = args.out or RESULTS.parent
    workdir = Path("var/soak")
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("*"):
        old.unlink()
    deployment = Deployment(workdir, instances=2)
    try:
        deployment.start()
        tenants = deployment.create_world(random.Random(args.seed), args.users, f"soak{args.seed}")
        deployment.fill()
        samples, extra = asyncio.run(soak(args.seed, args.minutes, args.sample_seconds, deployment, tenants))
    finally:
        deployment.stop()
    warmup_s = min(WARMUP_MINUTES * 60, args.minutes * 60 / 3)
    figures = judge(samples, warmup_s)
    out.mkdir(parents=True, exist_ok=True)
    columns = sorted({key for row in samples for key in row}, key=lambda key: (key != "t", key))
    with (out / "soak-latest.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(samples)
    plot(samples, out / "soak-latest.png")
    result = {
        **figures,
        "targets": TARGETS,
        "soak.minutes": args.minutes,
        "soak.sample_seconds": args.sample_seconds,
        "soak.warmup_seconds": warmup_s,
        "soak.samples": len(samples),
        "soak.users": extra["users"],
        "soak.status_changes": extra["status_changes"],
        "soak.instances": 2,
    }
    (out / "soak-latest.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
