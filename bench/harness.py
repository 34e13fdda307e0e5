"""What every bench phase stands on: sizes, the bench world, servers, the load generator, the peer."""

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SCHEDSTAT = Path("/proc/self/schedstat").exists()


@dataclass(frozen=True)
class Sizes:
    idle_connections: int
    cpu_idle_seconds: float
    notify_rate: float
    notify_seconds: float
    notify_watchers: int
    churn_rates: tuple[int, ...]
    churn_seconds: float
    connect_cpu_connections: int
    # Relay and the bare consumer measured this many times, alternating; the ratio is the median.
    connect_cpu_rounds: int
    # Frames per watcher in the fan-out bursts: Relay on each layer, and the ceiling server.
    ceiling_frames: int
    # Connects counted under callgrind (about 50 times slower than natively).
    instruction_connections: int
    # One stalled member and this many healthy ones in a channel, and the MB sent to it.
    slow_reader_healthy: int
    slow_reader_mb: int
    # RELAY_MAX_PENDING_BYTES for that phase; None leaves the default (4 MiB).
    slow_reader_bound: int | None
    # The peer's churn climb (it starts lower than Relay's).
    peer_churn_rates: tuple[int, ...]
    # Members of the big room (all reconnecting within `bigroom_window` seconds).
    bigroom_members: int
    bigroom_window: float
    # Users on the instance that is SIGKILLed in the reap phase.
    reap_users: int
    # Connects per server in the paced-against-burst comparison, and the pace.
    paced_connections: int
    paced_rate: float
    # Presence transitions (an online and an offline per subject) in each run of the webhooks phase.
    webhook_transitions: int = 1000


# The climb goes in 50/s steps up to the 500/s target, so the highest rate held is known within 50.
FULL_CHURN_RATES = (*range(100, 501, 50), 600, 800, 1000)
FULL = Sizes(
    10_000, 10.0, 100, 10.0, 20, FULL_CHURN_RATES, 5.0, 2000, 5, 1000, 300, 1000, 40, None,
    (10, 25, 50, 75, 100, 150, 200), 2000, 10.0, 10_000, 500, 50.0,
)  # fmt: skip
QUICK = Sizes(
    1_000, 5.0, 100, 3.0, 20, (100, 150, 200, 400), 2.0, 500, 3, 300, 100, 200, 12, None,
    (10, 25, 50, 100), 500, 5.0, 2000, 150, 50.0, 400,
)  # fmt: skip
# CI's smoke run: every phase and every key, in seconds; the numbers mean nothing at this size.
# Its slow reader passes the smallest bound allowed, so that its close is run too.
SMOKE = Sizes(
    40, 1.0, 20, 1.0, 3, (20,), 1.0, 20, 1, 10, 5, 5, 6, 64 * 1024, (20,), 20, 1.0, 40, 10, 50.0, 40
)  # fmt: skip
MODES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}

# Scaled presence timings for the churn phases, so each pair's `offline` lands in the window.
CHURN_TIMINGS = {
    "RELAY_PRESENCE_GRACE_MS": "300",
    "RELAY_PRESENCE_TTL_MS": "3000",
    "RELAY_PRESENCE_REFRESH_MS": "1000",
    "RELAY_PRESENCE_MARGIN_MS": "50",
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ── process readings ─────────────────────────────────────────────────────────
def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def peak_rss_kb(pid: int) -> int:
    """The most memory the process has held at once since it started (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_cpu_seconds(pid: int) -> float:
    """CPU time of a process's live threads, to the nanosecond (`/proc/<pid>/stat` counts 10 ms ticks).

    A thread that ends takes its time with it; a server's threads (the event loop, the database
    thread, Twisted's pool) live as long as it does. Without schedstat: the ticks, for every
    reading, so that two readings are never in different units.
    """
    if not SCHEDSTAT:
        return cpu_seconds(pid)
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended since the listing
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total / 1e9


def redis_cpu_seconds(client: Any) -> float:
    """CPU seconds the Redis server has used (user + system), from INFO."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_calls(client: Any) -> int:
    return sum(stats["calls"] for stats in client.info("commandstats").values())


class CommandLog:
    """Every command Redis runs, read from MONITOR in a thread, each marked sent or run by a script.

    INFO commandstats counts the commands a Lua script calls as well as the ones a client sends,
    so it cannot tell "one EVALSHA" from "nine commands"; MONITOR tags the script's with `lua`.
    """

    def __init__(self, url: str) -> None:
        import threading

        import redis

        self.entries: list[tuple[float, bool, str]] = []
        self._client = redis.Redis.from_url(url)
        self._monitor = self._client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        import redis

        try:
            for command in self._monitor.listen():
                self.entries.append((time.monotonic(), command["client_type"] == "lua", command["command"]))
        except (redis.ConnectionError, ValueError):
            return

    def between(self, start: float, end: float) -> tuple[list[str], list[str]]:
        """(commands clients sent, commands scripts ran) between two monotonic instants."""
        window = [entry for entry in self.entries if start <= entry[0] < end]
        return [c for _, lua, c in window if not lua], [c for _, lua, c in window if lua]

    def close(self) -> None:
        self._client.connection_pool.disconnect()
        self._thread.join(timeout=2)


# ── the bench database ───────────────────────────────────────────────────────
class World:
    """The bench database and everything the scenarios need from it: users, channels, tokens."""

    def __init__(self, workdir: Path, redis_url: str) -> None:
        self.database = workdir / "bench.sqlite3"
        os.environ["DATABASE_URL"] = f"sqlite:///{self.database}"
        os.environ["RELAY_REDIS_URL"] = redis_url
        # Relay's own settings, as deployed, also when the suite runs the smoke (pytest-django
        # exports the suite's settings, which switch off what in-process tests start themselves).
        os.environ["DJANGO_SETTINGS_MODULE"] = "relay.settings"
        # DEBUG is off, as deployed, so the servers (which inherit this environment) need a key.
        os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_urlsafe(48))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=BASE_DIR, check=True)
        import django

        django.setup()
        from relay.models import Environment

        # Above the big room's 2,000 members, so it is still announced person by person; the
        # huge-room phase lowers it for its own run (bench/rooms.py).
        self.environment = Environment.objects.create(name="bench", large_room_members=100_000)

    def users(self, prefix: str, count: int) -> list[str]:
        from relay.models import User

        ids = [f"{prefix}-{index}" for index in range(count)]
        User.objects.bulk_create([User(environment=self.environment, external_id=uid) for uid in ids], batch_size=2000)
        return ids

    def channel(self, name: str, members: list[str]) -> str:
        from relay.models import Channel, Membership, User

        channel = Channel.objects.create(environment=self.environment, name=name, type="private")
        users = User.objects.filter(environment=self.environment, external_id__in=members)
        Membership.objects.bulk_create([Membership(channel=channel, user=user) for user in users], batch_size=2000)
        return str(channel.id)

    def token(self, user_id: str) -> str:
        from relay.tokens import mint_token

        return mint_token(self.environment, user_id, 6 * 3600)[0]


# ── servers ──────────────────────────────────────────────────────────────────
class Server:
    """A child process serving WebSockets on a port; knows its pid for /proc readings."""

    # Every server this run started, by port: a failed phase names the ones its error mentions.
    by_port: dict[int, "Server"] = {}

    def __init__(self, name: str, argv: list[str], env: dict[str, str], workdir: Path, port: int) -> None:
        self.name, self.port = name, port
        self.log_path = workdir / f"{name}.log"
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen(argv, cwd=BASE_DIR, env=env, stdout=self.log, stderr=self.log)
        self.stopped = False
        if port:
            Server.by_port[port] = self

    def describe(self, lines: int = 5) -> str:
        """Its name, port, whether it still runs, its log's path and last lines."""
        code = self.process.poll()
        state = "stopped by the bench" if self.stopped else "running" if code is None else f"exited with {code}"
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:] if self.log_path.exists() else []
        return "\n".join([f"{self.name} (port {self.port}, {state}), log {self.log_path}:", *tail])

    @property
    def pid(self) -> int:
        return self.process.pid

    def ws_url(self, query: str) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws?{query}"

    def wait_ready(self, timeout: float = 60) -> "Server":
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} (port {self.port}) exited before listening; see its log")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not listen on {self.port}")

    @property
    def died(self) -> bool:
        """It ended without the bench stopping it."""
        return not self.stopped and self.process.poll() is not None

    def stop(self) -> None:
        self.stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def daphne(
    name: str,
    workdir: Path,
    app: str = "relay.asgi:application",
    under: str = "",
    ready_seconds: float = 60,
    options: str = "",
    **env: str,
) -> Server:
    """A Daphne process serving `app` (`under`: a command line it runs inside, such as valgrind's;
    `options`: more of Daphne's command-line options)."""
    from devtools.embedded_redis import free_port

    port = free_port()
    child_env = {**os.environ, "RELAY_LOG_FORMAT": "json", **env}
    # Daphne itself does not raise the file limit; 10,000 sockets need it.
    # relay.serve is Daphne on uvloop (the way Relay is served); the bare baseline runs on the same.
    argv = [
        "bash",
        "-c",
        f'ulimit -n "$(ulimit -Hn)"; exec {under} "{sys.executable}" -m relay.serve'
        f" -b 127.0.0.1 -p {port} {options} {app}",
    ]
    return Server(name, argv, child_env, workdir, port).wait_ready(ready_seconds)


def ceiling_server(workdir: Path) -> Server:
    from devtools.embedded_redis import free_port

    port = free_port()
    return Server(
        "ceiling", [sys.executable, "-m", "bench.ceiling", str(port)], dict(os.environ), workdir, port
    ).wait_ready()


# ── the phases ───────────────────────────────────────────────────────────────
@dataclass
class Bench:
    """What every phase runs on: the mode's sizes, the world, Redis, and the results so far."""

    mode: str
    sizes: Sizes
    world: World
    workdir: Path
    redis_url: str
    redis: Any
    with_peer: bool
    results: dict[str, Any] = field(default_factory=dict)
    # The churn climbs' steps, for latest.md's table.
    steps: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Phase:
    """One entry of bench/run.py's `PHASES`: its `--only` name, what runs it, its sizes and targets.

    `run(bench, sizes)` returns the phase's keys. `sizes` maps each mode (full, quick, smoke) to
    the phase's own sizes; without it, `run` gets the shared `Sizes` of the mode.
    """

    name: str
    run: Callable[[Bench, Any], dict]
    sizes: Mapping[str, Any] | None = None
    targets: Mapping[str, tuple[str, float]] = field(default_factory=dict)

    def sizes_for(self, bench: Bench) -> Any:
        return self.sizes[bench.mode] if self.sizes else bench.sizes


# ── the load generator ───────────────────────────────────────────────────────
class LoadGen:
    """One run of bench/loadgen.py with one job."""

    def __init__(self, job: dict) -> None:
        argv = ["bash", "-c", f'ulimit -n "$(ulimit -Hn)"; exec "{sys.executable}" -m bench.loadgen']
        self.process = subprocess.Popen(argv, cwd=BASE_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()

    def expect(self, event: str) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"loadgen ended before {event!r} (exit {self.process.wait()})")
        message = json.loads(line)
        if message["event"] == "failed":
            raise RuntimeError(f"loadgen, waiting for {event!r}: {message['error']}")
        if message["event"] != event:
            raise RuntimeError(f"loadgen said {message} while {event!r} was expected")
        return message

    def release(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self) -> dict:
        result = self.expect("result")
        self.process.wait(timeout=60)
        return result

    def kill(self) -> None:
        """End it at once (a phase that failed while it ran)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def run_job(job: dict) -> dict:
    return LoadGen(job).finish()


def open_and_close(urls: list[str]) -> None:
    """Open these connections, wait for every ack, close them."""
    load = LoadGen({"scenario": "idle", "urls": urls})
    load.expect("ready")
    load.release()
    load.finish()


def peer_users(usernames: list[str]) -> None:
    """The peer's users (django.contrib.auth's, by name): the same people as Relay's."""
    from django.contrib.auth.models import User

    User.objects.bulk_create([User(username=name) for name in usernames], batch_size=2000, ignore_conflicts=True)


# The peer's presence timings at the bench's scale: a row lives CHANNELS_PRESENCE_MAX_AGE without a
# heartbeat (Relay's TTL), clients beat and the prune job runs every refresh interval (Relay's refresh).
PEER_HEARTBEAT_S = 1.0
PEER_PRUNE_S = 1.0
PEER_MAX_AGE_S = 3.0


class Peer:
    """Two peer instances (bench/peers/asgi.py) and its prune job, on the bench database."""

    migrated = False

    def __init__(self, name: str, workdir: Path, count: int = 2) -> None:
        env = {"DJANGO_SETTINGS_MODULE": "bench.peers.settings", "BENCH_PEER_MAX_AGE_S": str(PEER_MAX_AGE_S)}
        if not Peer.migrated:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=BASE_DIR, check=True, env={**os.environ, **env}
            )
            Peer.migrated = True
        self.prune = Server(
            f"{name}-prune",
            [sys.executable, "-m", "bench.peers.prune", str(PEER_PRUNE_S)],
            {**os.environ, **env},
            workdir,
            0,
        )
        self.servers = [
            daphne(f"{name}-{index}", workdir, app="bench.peers.asgi:application", **env) for index in range(count)
        ]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.prune.stop()
