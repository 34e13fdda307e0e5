"""Shared fixtures: a real Redis, tenants with their personas, API clients, live instances and clocks.

Who is who: in tenant "acme", linh and tuan share the channels
"fleet" (private) and "general" (public); "hermit" belongs to nothing. Tenant
"globex" is the other side of every tenant wall and has its own "linh".
"""

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis
from asgiref.sync import SyncToAsync
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import Client

from agents import actions as agents_actions
from devtools.embedded_redis import EmbeddedRedis
from devtools.redis_cluster import EmbeddedRedisCluster, find_cluster_redis_server
from presence import actions as presence_actions
from presence.scripts import presence_key
from relay import tokens
from relay.models import ApiKey, Environment
from relay.settings import channel_layers_for
from tests.support import (
    Closing,
    FrozenClock,
    Instance,
    ManualClock,
    Tenant,
    database_url,
    instance_env,
    new_instance,
    on_cluster,
    published,
    until,
)

# Each phase's report ("setup", "call", "teardown"), so a fixture's teardown can tell
# that its test failed (the browser tests keep screenshots of failures).
PHASE_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    item.stash.setdefault(PHASE_REPORTS, {})[report.when] = report
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (`make test`: `--dist loadgroup`), a file's tests stay on one worker, as
    # they share module fixtures; the `heavy` tests form one group that runs first, one test at a
    # time, so no two of them share the cores. This runs before xdist's own hook reads the groups.
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        heavy = item.get_closest_marker("heavy") is not None
        item.add_marker(pytest.mark.xdist_group("heavy" if heavy else item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


def pytest_configure(config: pytest.Config) -> None:
    # Every server the suite talks to is on loopback. urllib (the health checks, the API calls)
    # and websockets (the clients) both follow HTTP(S)_PROXY from the environment, so behind a
    # proxy the suite's requests went to it and every live test failed; loopback bypasses it.
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = ",".join(filter(None, [os.environ.get(name), "127.0.0.1", "localhost"]))
    # The test database is a file (live Daphne processes share it) in var/, which a
    # fresh clone does not have yet.
    test_name = settings.DATABASES["default"]["TEST"].get("NAME")
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and test_name:
        Path(test_name).parent.mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis | None]:
    """The suite's Redis: RELAY_REDIS_URL when set, else a private embedded redis-server."""
    if os.environ.get("RELAY_REDIS_URL"):
        yield None
        return
    server = EmbeddedRedis().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedRedisCluster]:
    """A private Redis Cluster (3 masters, 3 replicas) shared by the `cluster` tests; started on first use."""
    if find_cluster_redis_server() is None:
        pytest.skip("Redis Cluster needs redis-server 7 or later (make test installs Debian's redis-server)")
    cluster = EmbeddedRedisCluster().start()
    yield cluster
    cluster.close()


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def fabric(request: pytest.FixtureRequest) -> Callable[..., dict]:
    """Instance settings (keyword arguments: more of them) for one Redis: a test taking it runs twice,
    on the suite's single Redis and with the layer and presence on the local cluster."""
    if request.param == "single":
        return lambda **extra: extra
    cluster = request.getfixturevalue("redis_cluster")
    return lambda **extra: on_cluster(cluster, **extra)


@pytest.fixture(scope="session")
def redis_url(redis_server: EmbeddedRedis | None) -> str:
    return redis_server.url if redis_server else os.environ["RELAY_REDIS_URL"]


@pytest.fixture(scope="session", autouse=True)
def _point_settings_at_test_redis(redis_url: str) -> None:
    # Settings were read before any fixture could start Redis, so the channel layer
    # and presence store are pointed at it here, before anything connects.
    settings.RELAY_REDIS_URL = redis_url
    settings.RELAY_PRESENCE_REDIS_URL = redis_url
    settings.CHANNEL_LAYERS = channel_layers_for(redis_url)


@pytest.fixture(scope="session", autouse=True)
def _close_worker_thread_connections(django_db_setup: None) -> Iterator[None]:
    """Close the database connection asgiref's worker thread keeps, before the test database goes.

    In-process async tests reach the database through database_sync_to_async, which runs in
    asgiref's one thread-sensitive worker; its connection outlives the tests, and PostgreSQL
    refuses to drop a database that a session still holds ("being accessed by other users").
    Depending on django_db_setup makes this teardown run before that one.
    """
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result()


@pytest.fixture(autouse=True)
def _fresh_redis(redis_url: str) -> None:
    """Every test starts with an empty Redis and a fresh channel layer."""
    from channels.layers import channel_layers

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    client.close()
    channel_layers.backends.clear()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def make_tenant(db: None) -> Callable[[str], Tenant]:
    """A factory of empty tenants, each with one API key."""

    def make(name: str) -> Tenant:
        environment = Environment.objects.create(name=name)
        _, secret = ApiKey.issue(environment)
        return Tenant(environment=environment, api_key=secret)

    return make


@pytest.fixture
def acme(make_tenant: Callable[[str], Tenant]) -> Tenant:
    tenant = make_tenant("acme")
    for user_id in ("linh", "tuan", "hermit"):
        tenant.add_user(user_id)
    tenant.add_channel("fleet", "private", members=("linh", "tuan"))
    tenant.add_channel("general", "public", members=("linh", "tuan"))
    return tenant


@pytest.fixture
def globex(make_tenant: Callable[[str], Tenant]) -> Tenant:
    tenant = make_tenant("globex")
    tenant.add_user("linh")
    tenant.add_user("zed")
    tenant.add_channel("board", "private", members=("linh", "zed"))
    return tenant


@pytest.fixture
def staff(db: None) -> Client:
    """Django's test client logged in to admin as a superuser."""
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("staff", "staff@example.com", "pw-unused-here"))
    return client


class ApiClient:
    """Django's test client speaking JSON with a Bearer API key."""

    def __init__(self, api_key: str | None) -> None:
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def call(self, method: str, path: str, body: object = None, raw: str | bytes | None = None):
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return getattr(self.client, method.lower())(
            path, data=data, content_type="application/json", headers=self.headers
        )


@pytest.fixture
def api_for() -> Callable[[Tenant | None], ApiClient]:
    return lambda tenant: ApiClient(tenant.api_key if tenant else None)


@pytest.fixture
def live_instances(transactional_db: None, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., list[Instance]]]:
    """Start `count` real Daphne processes on the test database and Redis.

    Keyword arguments become environment variables (e.g. RELAY_PRESENCE_GRACE_MS="300");
    `server="daphne"` runs Daphne's own command instead of `relay.serve`, and `args` are more of
    Daphne's options (e.g. `("--application-close-timeout", "1")`).
    Every instance is stopped when the test ends.
    """
    started: list[Instance] = []
    database = database_url(settings.DATABASES["default"])

    def start(
        count: int = 2, server: str = "relay.serve", args: tuple[str, ...] = (), **overrides: str
    ) -> list[Instance]:
        env = instance_env(database, overrides.pop("RELAY_REDIS_URL", redis_url), **overrides)
        instances = [new_instance(f"gw{len(started) + i}", tmp_path, env, server, args) for i in range(count)]
        for instance in instances:
            started.append(instance.start())
        return instances

    yield start
    for instance in started:
        instance.stop()


@pytest.fixture
async def closing() -> AsyncIterator[Closing]:
    """Sockets that close themselves when the test ends (tests/support.py, `Closing`)."""
    opened = Closing()
    yield opened
    await opened.close_all()


@pytest.fixture
async def close_presence_service() -> AsyncIterator[None]:
    """Stop the test loop's presence service when the test ends: its timers, tasks and Redis client."""
    yield
    await presence_actions.service().close()


@pytest.fixture
def empty_secret_cache() -> None:
    """Start with no environment's signing secret, nor the list of environments, cached in this process."""
    tokens._environments.clear()
    tokens._rechecked.clear()
    tokens._known = (float("-inf"), frozenset())


@pytest.fixture
def presence_clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """Presence's clock for this test, moved by hand (`advance`) instead of slept on.

    The test loop's presence service takes it when the test's first connection creates the
    service. Redis keeps its own time: a key the service re-pins still expires for real.
    """
    clock = ManualClock()
    monkeypatch.setattr(presence_actions, "clock", clock)
    return clock


@pytest.fixture
def run_grace_check(
    presence_clock: ManualClock, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> Callable[[Tenant, str], Awaitable[None]]:
    """Run a user's pending grace check on `presence_clock`, once it is proven to wait for the clock.

    For a test with a tiny RELAY_PRESENCE_GRACE_MS, after the user's last close: once Redis has
    expired the re-pinned key (a check that ran now would publish `offline`), the check must stay
    pending, with no `offline` published, until the clock reaches grace + margin; then it runs.
    """

    async def run(tenant: Tenant, user_id: str) -> None:
        subject = (str(tenant.environment.id), user_id)
        await until(lambda: not redis_client.exists(presence_key(*subject)))
        service = presence_actions.service()
        presence_clock.advance(service.timings.check_delay / 1000 - 0.001)
        assert subject in service.pending
        assert (user_id, "offline") not in published(caplog)
        presence_clock.advance(0.002)
        assert subject not in service.pending

    return run


@pytest.fixture
def agents_clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    """The agent registry's clock, frozen at T0 and moved by hand: no test sleeps for a TTL."""
    clock = FrozenClock()
    monkeypatch.setattr(agents_actions, "clock", clock)
    return clock
