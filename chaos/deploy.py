"""The deployment under test: Redis, the fault proxy in front of it, a database, and live instances.

Instances are the test suite's (tests/support.py: `Instance`, started with `python -m relay.serve`
and scaled-down presence timings); the world (tenants, users, channels, memberships, tokens) is
made through `manage.py createenvironment` and the HTTP API only, as an application would.
"""

import contextlib
import functools
import json
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.embedded_redis import EmbeddedRedis, free_port
from tests.support import BASE_DIR, Instance, http, instance_env, new_instance, timings

# Presence timings of the run (ms): the refresh a third of the TTL as in production, all scaled so
# that a fault's aftermath settles in seconds, yet wide enough that a loaded two-core machine,
# whose processes can stall for a second or two, does not pass for a fault.
GRACE_MS, TTL_MS, REFRESH_MS, MARGIN_MS = 2500, 5000, 1600, 400
# The checker's allowance for a loaded machine: how late a frame may be read, in seconds.
SLACK_S = 3.0
# A stalled reader's output passes this quickly enough for its 4008 to be part of the run.
PENDING_BYTES = 65536
TOKEN_TTL_S = 6 * 3600


def timings_ms() -> dict[str, int]:
    return {"grace_ms": GRACE_MS, "ttl_ms": TTL_MS, "refresh_ms": REFRESH_MS, "margin_ms": MARGIN_MS}


@dataclass
class Tenant:
    """One environment of the run, named `label` in the history."""

    label: str
    environment: str
    api_key: str
    users: list[str] = field(default_factory=list)
    # channel id -> name
    channels: dict[str, str] = field(default_factory=dict)
    # user -> the channel they are never removed from (so everyone always has one)
    home: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    # (channel, user) at the start
    members: list[tuple[str, str]] = field(default_factory=list)


class Proxy:
    """The fault proxy process (chaos/proxy.py) and its command line."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "chaos.proxy", str(self.port), str(upstream_port)],
            cwd=BASE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()
        self._expect_ok()

    def _expect_ok(self) -> None:
        answer = self.process.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the fault proxy answered {answer!r}")

    def command(self, line: str) -> None:
        """Send one command (`pass`, `delay S`, `drop`, `cut`) and wait until it took effect."""
        with self._lock:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
            self._expect_ok()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        self.process.terminate()
        self.process.wait(timeout=10)


class Deployment:
    """Everything a run stands on, started in `start` and stopped in `stop`."""

    def __init__(self, directory: Path, instances: int = 3) -> None:
        self.directory = directory
        self.count = instances
        url = os.environ.get("DATABASE_URL", "")
        self.database = url if url.startswith("postgres") else f"sqlite:///{directory / 'chaos.sqlite3'}"
        self.redis = EmbeddedRedis()
        self.proxy: Proxy | None = None
        self.instances: list[Instance] = []
        # Every instance ever started (their logs are scanned at the end).
        self.started: list[Instance] = []
        self._names = 0
        self._lock = threading.Lock()
        self.env: dict[str, str] = {}

    def manage(self, *args: str) -> str:
        """Run `manage.py` against the run's database; return its last line of output."""
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            env={**self.env, "RELAY_LOG_FORMAT": "console"},
            check=True,
            capture_output=True,
            text=True,
        )
        return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""

    def start(self) -> "Deployment":
        self.redis.start()
        self.proxy = Proxy(self.redis.port)
        self.env = instance_env(
            self.database,
            self.proxy.url,
            **timings(GRACE_MS, TTL_MS, REFRESH_MS, MARGIN_MS, RELAY_MAX_PENDING_BYTES=PENDING_BYTES),
        )
        self.manage("migrate", "-v", "0")
        self.add_instance()
        return self

    def add_instance(self) -> Instance:
        """Start one more instance and put it in service."""
        with self._lock:
            self._names += 1
            name = f"gw{self._names}"
        instance = new_instance(name, self.directory, self.env)
        with self._lock:
            self.started.append(instance)
        instance.start(timeout=60)
        with self._lock:
            self.instances.append(instance)
        return instance

    def fill(self) -> None:
        """Start instances until `count` serve, all at once."""
        missing = self.count - len(self.instances)
        with ThreadPoolExecutor(max(1, missing)) as pool:
            list(pool.map(lambda _: self.add_instance(), range(missing)))

    def serving(self) -> list[Instance]:
        with self._lock:
            return list(self.instances)

    def take_out(self, rng: random.Random) -> Instance:
        """Take one instance out of service (clients stop choosing it) and return it."""
        with self._lock:
            instance = rng.choice(self.instances)
            self.instances.remove(instance)
            return instance

    def api(self, method: str, path: str, body: Any = None, api_key: str | None = None) -> tuple[int, Any]:
        """One HTTP call to a serving instance."""
        return http(method, f"{self.serving()[0].http_url}{path}", body, api_key)

    # ── the world ───────────────────────────────────────────────────────────
    def create_world(self, rng: random.Random, users: int, label: str) -> list[Tenant]:
        """Two tenants of `users` in all, half of each tenant's user ids also used by the other tenant."""
        tenants = []
        per_tenant = max(4, users // 2)
        shared = per_tenant // 2
        for tenant_label in ("a", "b"):
            created = json.loads(self.manage("createenvironment", f"chaos-{label}-{tenant_label}-{time.time_ns()}"))
            tenant = Tenant(tenant_label, created["environment"], created["api_key"])
            tenant.users = [f"u{i:03d}" for i in range(shared)] + [
                f"{tenant_label}{i:03d}" for i in range(per_tenant - shared)
            ]
            tenants.append(tenant)
        with ThreadPoolExecutor(8) as pool:
            for tenant in tenants:
                new_user = functools.partial(self._add_user, tenant)
                list(pool.map(new_user, tenant.users))
                for index in range(max(3, per_tenant // 10)):
                    kind = rng.choice(("public", "private"))
                    created = self._must(201, "POST", "/v1/channels", {"name": f"c{index:02d}", "type": kind}, tenant)
                    tenant.channels[created["id"]] = created["name"]
                channel_ids = sorted(tenant.channels)
                members = []
                for user in tenant.users:
                    tenant.home[user] = rng.choice(channel_ids)
                    others = rng.sample(channel_ids, k=rng.randint(1, 2))
                    members += [(channel, user) for channel in {tenant.home[user], *others}]
                list(pool.map(lambda pair, t=tenant: self._add_member(t, *pair), members))
                tenant.members = members
            for tenant in tenants:
                for user in tenant.users:
                    tenant.tokens[user] = self._token(tenant, user)
        return tenants

    def _must(self, status: int, method: str, path: str, body: Any, tenant: Tenant) -> Any:
        answer_status, answer = self.api(method, path, body, tenant.api_key)
        if answer_status != status:
            raise RuntimeError(f"{method} {path} answered {answer_status}: {answer}")
        return answer

    def _add_user(self, tenant: Tenant, user: str) -> None:
        self._must(201, "POST", "/v1/users", {"id": user}, tenant)

    def _add_member(self, tenant: Tenant, channel: str, user: str) -> None:
        self._must(201, "PUT", f"/v1/channels/{channel}/members/{user}", None, tenant)

    def _token(self, tenant: Tenant, user: str) -> str:
        while True:
            status, answer = self.api("POST", "/v1/tokens", {"user": user, "ttl_seconds": TOKEN_TTL_S}, tenant.api_key)
            if status == 201:
                return answer["token"]
            if status != 429:
                raise RuntimeError(f"POST /v1/tokens answered {status}: {answer}")
            time.sleep(0.2)

    # ── the end ────────────────────────────────────────────────────────────
    def stop(self) -> None:
        for instance in self.started:
            instance.stop()
        if self.proxy:
            self.proxy.stop()
        self.redis.resume()
        self.redis.close()

    def tracebacks(self) -> list[dict]:
        """Every traceback the instances logged, and how many lines each log had."""
        found = []
        for instance in self.started:
            if not instance.log_path.exists():
                continue
            lines = instance.log_path.read_text(errors="replace").splitlines()
            found.append({"k": "logscan", "instance": instance.name, "lines": len(lines)})
            block: list[str] = []
            for line in [*lines, "{}"]:
                parsed = None
                with contextlib.suppress(json.JSONDecodeError):
                    parsed = json.loads(line)
                if isinstance(parsed, dict):
                    if block and any("Traceback" in part for part in block):
                        found.append({"k": "log", "instance": instance.name, "text": "\n".join(block)[-4000:]})
                    block = []
                    if "Traceback" in str(parsed.get("exception", "")):
                        found.append({"k": "log", "instance": instance.name, "text": line[-4000:]})
                else:
                    block.append(line)
        return found
