"""Operational endpoints: liveness, readiness and Prometheus metrics.

The probes are open and name no tenant. /metrics is not public: it tells who can scrape it how
many connections, users and agents an instance holds, so it answers only a bearer of
RELAY_METRICS_TOKEN when one is set, and only loopback clients when none is.
"""

import hmac
import ipaddress
from typing import Any, Literal

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ConfigDict, with_config
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from typing_extensions import TypedDict

from relay.api import ErrorBody, Operation, documented, endpoint, error_response
from relay.redis_clients import cluster_options, cluster_sync_client, sync_client


@with_config(ConfigDict(extra="forbid"))
class Alive(TypedDict):
    status: Literal["ok"]


@with_config(ConfigDict(extra="forbid"))
class Readiness(TypedDict):
    status: Literal["ok", "unavailable"]
    # database, redis (presence_redis when it is another one); on a Redis Cluster, database,
    # redis_cluster (and presence_redis when presence has a Redis of its own): "ok" or the error's name.
    checks: dict[str, str]


def ping(url: str, timeout: float = 0.5) -> str:
    """Return "ok" when the Redis at `url` answers PING within `timeout`, else the error's name."""
    client = sync_client(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
        return "ok"
    except redis.RedisError as error:
        return type(error).__name__
    finally:
        client.close()


def ping_cluster(nodes: list[tuple[str, int]], timeout: float = 0.5, **options: Any) -> str:
    """Return "ok" when every master of the Redis Cluster `nodes` belong to answers PING, else the error's name."""
    try:
        client = cluster_sync_client(nodes, socket_connect_timeout=timeout, socket_timeout=timeout, **options)
    except (redis.RedisError, RedisClusterException) as error:
        return type(error).__name__
    try:
        client.ping(target_nodes=RedisCluster.PRIMARIES)
        return "ok"
    except (redis.RedisError, RedisClusterException) as error:
        return type(error).__name__
    finally:
        client.close()


def _is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def scrape_refusal(request: HttpRequest) -> HttpResponse | None:
    """Why `request` may not read /metrics (401 or 403), or None when it may."""
    expected = settings.RELAY_METRICS_TOKEN
    if expected is None:
        if _is_loopback(request.META.get("REMOTE_ADDR")):
            return None
        return error_response(403, "forbidden", "loopback clients only, unless RELAY_METRICS_TOKEN is set")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return error_response(401, "unauthorized", "send Authorization: Bearer <RELAY_METRICS_TOKEN>")
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        return error_response(403, "forbidden", "wrong metrics token")
    return None


@endpoint("GET", authenticated=False)
@documented(
    GET=Operation(
        "Prometheus metrics: to a bearer of RELAY_METRICS_TOKEN, or to loopback clients when it is unset",
        {200: str, 401: ErrorBody, 403: ErrorBody},
        tags=("operations",),
    )
)
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format for this instance, to a scraper that may read it."""
    refusal = scrape_refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@endpoint("GET", authenticated=False)
@documented(GET=Operation("Liveness: 200 while the process runs", {200: Alive}, tags=("operations",)))
def healthz(request: HttpRequest) -> HttpResponse:
    """200 while the process runs."""
    return JsonResponse(Alive(status="ok"))


@endpoint("GET", authenticated=False)
@documented(
    GET=Operation("Readiness: the database and Redis answer", {200: Readiness, 503: Readiness}, tags=("operations",))
)
def readyz(request: HttpRequest) -> HttpResponse:
    """200 when the database and Redis answer, else 503 naming what did not."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as error:
        checks["database"] = type(error).__name__
    if settings.RELAY_REDIS_CLUSTER_NODES:
        # The layer on the cluster (with RELAY_REDIS_URL's credentials), and presence too unless
        # it has a Redis of its own.
        checks["redis_cluster"] = ping_cluster(
            settings.RELAY_REDIS_CLUSTER_NODES, **cluster_options(settings.RELAY_REDIS_URL)
        )
        if not settings.RELAY_PRESENCE_CLUSTER_NODES:
            checks["presence_redis"] = ping(settings.RELAY_PRESENCE_REDIS_URL)
    else:
        checks["redis"] = ping(settings.RELAY_REDIS_URL)
        if settings.RELAY_PRESENCE_REDIS_URL != settings.RELAY_REDIS_URL:
            checks["presence_redis"] = ping(settings.RELAY_PRESENCE_REDIS_URL)
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(Readiness(status="ok" if ready else "unavailable", checks=checks), status=200 if ready else 503)
