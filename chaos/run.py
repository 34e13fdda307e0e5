"""One run: deploy, drive the clients and the nemesis, turn quiet, record, check, summarize."""

import asyncio
import json
import random
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from chaos import checker
from chaos.clients import Population
from chaos.deploy import SLACK_S, Deployment, Tenant, timings_ms
from chaos.history import HistoryWriter, read
from chaos.nemesis import FAULTS, Nemesis
from tests.support import BASE_DIR

RESULTS = BASE_DIR / "bench" / "results" / "chaos-latest.json"


def say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


def replay_command(seed: int, minutes: float, users: int, faults: tuple[str, ...]) -> str:
    command = f"python -m chaos --seed {seed} --minutes {minutes:g} --users {users}"
    return command if faults == FAULTS else f"{command} --faults {','.join(faults)}"


async def drive(
    seed: int,
    minutes: float,
    deployment: Deployment,
    tenants: list[Tenant],
    history: HistoryWriter,
    faults: tuple[str, ...],
) -> None:
    """Clients, memberships and the nemesis for `minutes`; then quiet until presence must have settled."""
    population = Population(seed, deployment, tenants, history)
    nemesis = Nemesis(seed, deployment, population, history, faults)
    tasks = [asyncio.create_task(slot.run()) for slot in population.slots]
    tasks.append(asyncio.create_task(population.change_memberships()))
    faults = asyncio.create_task(nemesis.run())
    await asyncio.sleep(minutes * 60)
    population.quiet.set()
    await faults
    await asyncio.gather(*tasks)
    # Quiet: nothing changes; after TTL + grace + 2 refreshes (and the slack) every view must be true.
    timings = timings_ms()
    settle = (timings["ttl_ms"] + timings["grace_ms"] + 2 * timings["refresh_ms"]) / 1000 + SLACK_S
    await asyncio.sleep(settle + 1.0)
    history.write("checkpoint")
    await population.close_all()


def run_seed(seed: int, minutes: float, users: int, out: Path, faults: tuple[str, ...] = FAULTS) -> checker.Report:
    """Run one seed and check its history; everything lands in `out/<seed>/`."""
    directory = out / str(seed)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    rng = random.Random(seed)
    deployment = Deployment(directory)
    history = HistoryWriter(directory / "history.jsonl")
    try:
        say(f"seed {seed}: starting Redis, the fault proxy, the database and the instances")
        deployment.start()
        tenants = deployment.create_world(rng, users, f"{seed}")
        deployment.fill()
        history.write(
            "meta",
            seed=seed,
            wall=history.wall_origin,
            minutes=minutes,
            users=users,
            replay=replay_command(seed, minutes, users, faults),
            timings=timings_ms(),
            slack_s=SLACK_S,
            tenants={
                tenant.label: {"users": tenant.users, "channels": tenant.channels, "home": tenant.home}
                for tenant in tenants
            },
            members=[[tenant.label, channel, user] for tenant in tenants for channel, user in tenant.members],
        )
        say(f"seed {seed}: {sum(len(t.users) for t in tenants)} users; running for {minutes:g} min")
        asyncio.run(drive(seed, minutes, deployment, tenants, history, faults))
    finally:
        deployment.stop()
        for record in deployment.tracebacks():
            history.write(record.pop("k"), **record)
        history.write("end")
        history.close()
    report = checker.check(list(read(directory)))
    (directory / "report.json").write_text(json.dumps(asdict(report), indent=1))
    return report


def summarize(reports: list[checker.Report], minutes: float, users: int) -> dict:
    """What `make chaos` writes to bench/results/chaos-latest.json."""

    def total(field: str) -> dict[str, int]:
        sums: dict[str, int] = {}
        for report in reports:
            for key, value in getattr(report, field).items():
                sums[key] = sums.get(key, 0) + value
        return dict(sorted(sums.items()))

    return {
        "seeds": [report.seed for report in reports],
        "minutes_per_seed": minutes,
        "users": users,
        "operations": total("operations"),
        "faults": total("faults"),
        "invariants_checked": total("checks"),
        "violations": sum(sum(report.found.values()) for report in reports),
        "violations_by_invariant": total("found"),
        "violations_by_seed": {str(report.seed): sum(report.found.values()) for report in reports},
    }
