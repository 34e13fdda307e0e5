"""The nemesis: one fault at a time, chosen at random, each recorded with its start and its end."""

import asyncio
import random

from chaos.clients import Population, pause
from chaos.deploy import TTL_MS, Deployment
from chaos.history import HistoryWriter

TTL = TTL_MS / 1000
FAULTS = (
    "kill",  # SIGKILL an instance (its sockets die unclosed), then start a fresh one
    "term",  # SIGTERM an instance (it closes its sockets and leaves), then start a fresh one
    "redis_restart",  # SIGKILL Redis and start it again empty on the same port
    "redis_pause_short",  # SIGSTOP Redis for less than the TTL
    "redis_pause_long",  # SIGSTOP Redis for more than the TTL: presence keys expire under it
    "proxy_delay",  # every chunk between instances and Redis waits a while
    "proxy_drop",  # a partition shorter than the TTL: nothing flows, then everything held does
    "proxy_cut",  # every connection between instances and Redis reset at once
    "stall",  # one client stops reading its socket
)


class Nemesis:
    def __init__(
        self,
        seed: int,
        deployment: Deployment,
        population: Population,
        history: HistoryWriter,
        kinds: tuple[str, ...] = FAULTS,
    ) -> None:
        self.rng = random.Random(f"{seed}:nemesis")
        self.kinds = kinds
        self.deployment = deployment
        self.population = population
        self.history = history

    async def run(self) -> None:
        """Rest, inject a fault, heal it; until the run turns quiet (the fault under way is healed first)."""
        quiet = self.population.quiet
        while not quiet.is_set():
            # Some rests outlast the checker's convergence window, so presence is judged between faults.
            await pause(quiet, self.rng.uniform(2.0, 16.0))
            if quiet.is_set():
                return
            kind = self.rng.choice(self.kinds)
            started = self.history.now()
            target = await self.inject(kind)
            self.history.write("fault", t=started, t_end=self.history.now(), fault=kind, target=target)

    async def inject(self, kind: str) -> str | None:
        rng, deployment = self.rng, self.deployment
        if kind in ("kill", "term"):
            instance = deployment.take_out(rng)
            await asyncio.to_thread(instance.kill if kind == "kill" else instance.stop)
            await asyncio.to_thread(deployment.add_instance)
            return instance.name
        if kind == "redis_restart":
            await asyncio.to_thread(deployment.redis.kill)
            await asyncio.sleep(rng.uniform(0.1, 1.0))
            await asyncio.to_thread(deployment.redis.start)
            return None
        if kind.startswith("redis_pause"):
            seconds = TTL * (rng.uniform(0.2, 0.6) if kind.endswith("short") else rng.uniform(1.3, 2.0))
            deployment.redis.pause()
            await asyncio.sleep(seconds)
            deployment.redis.resume()
            return None
        if kind == "proxy_delay":
            # Each way: a round trip stays under presence's fail-fast timeout (presence/store.py).
            await asyncio.to_thread(deployment.proxy.command, f"delay {rng.uniform(0.02, 0.2):.3f}")
            await asyncio.sleep(rng.uniform(1.0, 5.0))
            await asyncio.to_thread(deployment.proxy.command, "pass")
            return None
        if kind == "proxy_drop":
            await asyncio.to_thread(deployment.proxy.command, "drop")
            await asyncio.sleep(TTL * rng.uniform(0.1, 0.6))
            await asyncio.to_thread(deployment.proxy.command, "pass")
            return None
        if kind == "proxy_cut":
            await asyncio.to_thread(deployment.proxy.command, "cut")
            return None
        if kind == "stall":
            return await self.population.stall_one(rng, rng.uniform(1.0, 8.0))
        raise ValueError(kind)
