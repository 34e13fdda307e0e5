"""Operational endpoints: liveness, readiness and Prometheus metrics."""

from typing import Literal

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from relay.api import Operation, documented, endpoint
from relay.redis_clients import sync_client


@with_config(ConfigDict(extra="forbid"))
class Alive(TypedDict):
    status: Literal["ok"]


@with_config(ConfigDict(extra="forbid"))
class Readiness(TypedDict):
    status: Literal["ok", "unavailable"]
    # database, redis (and presence_redis when it is another one): "ok" or the error's name.
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


@endpoint("GET", authenticated=False)
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format for this instance."""
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
    checks["redis"] = ping(settings.RELAY_REDIS_URL)
    if settings.RELAY_PRESENCE_REDIS_URL != settings.RELAY_REDIS_URL:
        checks["presence_redis"] = ping(settings.RELAY_PRESENCE_REDIS_URL)
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(Readiness(status="ok" if ready else "unavailable", checks=checks), status=200 if ready else 503)
