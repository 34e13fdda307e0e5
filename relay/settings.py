"""Relay's Django settings, read from the environment (see README, "Configuration").

Every tunable an operator may set is an environment variable read through the strict
helpers in `relay.env`: a bad value stops start-up with a message naming the variable.
"""

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from relay.env import (
    check_redis_url,
    check_secret_key,
    env_bool,
    env_choice,
    env_hosts,
    env_int,
    env_list,
    env_name,
    env_str,
)
from relay.redis_clients import cluster_options, layer_host

BASE_DIR = Path(__file__).resolve().parent.parent

# ── Django ───────────────────────────────────────────────────────────────────
DEBUG = env_bool("DEBUG", False)
# Signs admin sessions and CSRF tokens (connection tokens are signed with each environment's own
# secret, never with this one). The development default is refused unless DEBUG is on: a
# deployment that forgot its key would otherwise sign staff sessions with a published string.
DEVELOPMENT_SECRET_KEY = "relay-dev-insecure-secret-key-change-me-in-production"
SECRET_KEY = check_secret_key(
    "SECRET_KEY", env_str("SECRET_KEY"), development_default=DEVELOPMENT_SECRET_KEY, debug=DEBUG
)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "relay",
    "presence",
    "chat",
    "agents",
    "webhooks",
    "overview",
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# ── HTTPS (a deployment behind TLS, terminated here or at a proxy) ───────────
# RELAY_HTTPS: cookies only over HTTPS, plain HTTP redirected to HTTPS, and HSTS for
# RELAY_HSTS_SECONDS (a year unless set; 0 sends none). The probes stay reachable over plain
# HTTP: a load balancer's health check does not follow a redirect.
RELAY_HTTPS = env_bool("RELAY_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = RELAY_HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("RELAY_HSTS_SECONDS", 365 * 24 * 3600 if RELAY_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_PRELOAD = SECURE_HSTS_SECONDS > 0
# Behind a proxy that terminates TLS and sets X-Forwarded-Proto (and strips any the client
# sent): without it every request looks like plain HTTP and RELAY_HTTPS redirects for ever.
if env_bool("RELAY_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

ROOT_URLCONF = "relay.urls"
ASGI_APPLICATION = "relay.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# ── Database ─────────────────────────────────────────────────────────────────
DATABASES = {
    # Persistent connections: database_sync_to_async closes connections older than
    # CONN_MAX_AGE around every call, so 0 would reconnect (and re-run the SQLite
    # pragmas) several times per WebSocket connect.
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"), conn_max_age=600, conn_health_checks=True
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's ASGI handler runs each request's sync code on a fresh thread, so a
    # persistent per-thread connection would be left open behind every request until
    # PostgreSQL runs out of slots; a pool hands connections back at the end of each call.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 2, "max_size": 8}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several Daphne processes share one SQLite file: WAL lets readers run beside
    # the single writer, IMMEDIATE takes the write lock when a transaction starts
    # (instead of failing with "database is locked" when a reader upgrades), and
    # the timeout makes a writer wait for the lock rather than error at once.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    # Live-server tests run real Daphne processes against the test database, so it
    # must be a file they can all open, not SQLite's default in-memory database.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "var" / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# ── Redis and the channel layer ──────────────────────────────────────────────
# `make run` and the test fixtures start an embedded Redis and set RELAY_REDIS_URL;
# the fallback is a Redis on the default local port.
RELAY_REDIS_URL = check_redis_url("RELAY_REDIS_URL", env_str("RELAY_REDIS_URL", "redis://127.0.0.1:6379/0"))
# Presence keys only, so an operator can put presence on its own Redis and let it
# fail alone: the channel layer (and so messages) stays on RELAY_REDIS_URL.
RELAY_PRESENCE_REDIS_URL = check_redis_url(
    "RELAY_PRESENCE_REDIS_URL", env_str("RELAY_PRESENCE_REDIS_URL", RELAY_REDIS_URL)
)


# Redis Sentinel: when set, the sentinels name the master that RELAY_REDIS_URL's host stood for
# (its database, user and password still apply), for the layer and for presence unless
# RELAY_PRESENCE_REDIS_URL names another Redis.
RELAY_REDIS_SENTINELS = env_hosts("RELAY_REDIS_SENTINELS")
RELAY_REDIS_SENTINEL_MASTER = env_name("RELAY_REDIS_SENTINEL_MASTER", "mymaster")

# Redis Cluster: when set, the channel layer runs on the cluster these nodes belong to (sharded
# pub/sub, Redis 7 or later), and so does presence unless RELAY_PRESENCE_REDIS_URL names a single
# Redis for it. Of RELAY_REDIS_URL only the user, the password and TLS (rediss://) are used then,
# for the cluster's nodes.
RELAY_REDIS_CLUSTER_NODES = env_hosts("RELAY_REDIS_CLUSTER_NODES")
if RELAY_REDIS_CLUSTER_NODES and RELAY_REDIS_SENTINELS:
    raise ImproperlyConfigured(
        "RELAY_REDIS_CLUSTER_NODES and RELAY_REDIS_SENTINELS are both set: a Redis Cluster fails over by "
        "itself, without sentinels; set one of them"
    )
# The cluster presence runs on: empty when it runs on the single Redis at RELAY_PRESENCE_REDIS_URL.
RELAY_PRESENCE_CLUSTER_NODES = [] if env_str("RELAY_PRESENCE_REDIS_URL") else RELAY_REDIS_CLUSTER_NODES


def channel_layers_for(
    url: str, cluster_nodes: list[tuple[str, int]] | None = None, publish_retry_ms: int = 30_000
) -> dict:
    """Return the CHANNEL_LAYERS setting for a Redis at `url` (through the sentinels, when set), or a cluster.

    One PUBLISH per group send and one subscription per group per process: each instance
    fans out to its local sockets, as docs/presence.md, Fan-out describes. On a Redis Cluster
    (`cluster_nodes`), the same with SPUBLISH and SSUBSCRIBE (relay/transport/cluster.py), a
    send whose slot has no master retried for up to `publish_retry_ms`.
    """
    if cluster_nodes:
        return {
            "default": {
                "BACKEND": "relay.transport.cluster.RelayClusterChannelLayer",
                "CONFIG": {
                    "cluster_nodes": [list(node) for node in cluster_nodes],
                    "cluster_options": cluster_options(url),
                    "publish_retry_seconds": publish_retry_ms / 1000,
                    "prefix": "relay",
                },
            }
        }
    host = layer_host(url, RELAY_REDIS_SENTINELS, RELAY_REDIS_SENTINEL_MASTER)
    return {
        "default": {
            "BACKEND": "relay.transport.pubsub.RelayPubSubChannelLayer",
            "CONFIG": {"hosts": [host], "prefix": "relay"},
        }
    }


# ── Presence (docs/contract.md, 4. Presence semantics) ────────────────────────
# The production defaults, asserted once as constants by tests/test_settings.py.
DEFAULT_PRESENCE_GRACE_MS = 30_000
DEFAULT_PRESENCE_TTL_MS = 30_000
DEFAULT_PRESENCE_REFRESH_MS = 10_000
DEFAULT_PRESENCE_MARGIN_MS = 1_000
DEFAULT_MAX_CONNECTIONS_PER_USER = 5

# How long a user may be gone before `offline` is published.
RELAY_PRESENCE_GRACE_MS = env_int("RELAY_PRESENCE_GRACE_MS", DEFAULT_PRESENCE_GRACE_MS, minimum=1)
# The presence key's TTL while connections are open.
RELAY_PRESENCE_TTL_MS = env_int("RELAY_PRESENCE_TTL_MS", DEFAULT_PRESENCE_TTL_MS, minimum=1)
# Three refreshes per TTL, so two consecutive misses do not expire a live user.
RELAY_PRESENCE_REFRESH_MS = env_int("RELAY_PRESENCE_REFRESH_MS", DEFAULT_PRESENCE_REFRESH_MS, minimum=1)
# The grace check runs at grace + margin: on the grace itself, the re-pinned key's
# expiry and the timer are one instant reached by two clocks (docs/presence.md, The races: the margin).
RELAY_PRESENCE_MARGIN_MS = env_int("RELAY_PRESENCE_MARGIN_MS", DEFAULT_PRESENCE_MARGIN_MS, minimum=1)
# Open connections per user, enforced across all instances.
RELAY_MAX_CONNECTIONS_PER_USER = env_int("RELAY_MAX_CONNECTIONS_PER_USER", DEFAULT_MAX_CONNECTIONS_PER_USER, minimum=1)
if RELAY_PRESENCE_REFRESH_MS >= RELAY_PRESENCE_TTL_MS:
    raise ImproperlyConfigured(
        "RELAY_PRESENCE_REFRESH_MS must be well inside RELAY_PRESENCE_TTL_MS "
        f"(got refresh {RELAY_PRESENCE_REFRESH_MS} >= TTL {RELAY_PRESENCE_TTL_MS}): "
        "a key refreshed no faster than it expires drops live users"
    )

# On a Redis Cluster, a send waits for its slot's new master as long as presence rides out a
# failover (keys refreshed one interval before it began outlive it by TTL - refresh), and no
# longer: presence's own sends wait too, and its refresh behind them (docs/scaling.md, The
# channel layer on Redis Cluster).
CHANNEL_LAYERS = channel_layers_for(
    RELAY_REDIS_URL, RELAY_REDIS_CLUSTER_NODES, RELAY_PRESENCE_TTL_MS - RELAY_PRESENCE_REFRESH_MS
)

# ── Connections ──────────────────────────────────────────────────────────────
# What a connection may have queued and not yet written to its socket before it is closed with
# 4008 (relay/transport/pending_output.py). At least 64 KiB: a `message.created` of 16,384
# four-byte characters is that big, and every connection must be able to take one.
DEFAULT_MAX_PENDING_BYTES = 4 * 1024 * 1024
RELAY_MAX_PENDING_BYTES = env_int("RELAY_MAX_PENDING_BYTES", DEFAULT_MAX_PENDING_BYTES, minimum=64 * 1024)
# Frames a connection may send a second, with bursts of twice as many (relay/rate_limits.py);
# the excess is answered `rate_limited` and does nothing else.
DEFAULT_RATE_FRAMES_PER_S = 50
RELAY_RATE_FRAMES_PER_S = env_int("RELAY_RATE_FRAMES_PER_S", DEFAULT_RATE_FRAMES_PER_S, minimum=1)

# ── What a tenant can create (PUT /v1/channels/<id>/members/<user> past either: 409 limit_reached) ─
DEFAULT_MAX_CHANNELS_PER_USER = 1_000
RELAY_MAX_CHANNELS_PER_USER = env_int("RELAY_MAX_CHANNELS_PER_USER", DEFAULT_MAX_CHANNELS_PER_USER, minimum=1)
DEFAULT_MAX_MEMBERS_PER_CHANNEL = 100_000
RELAY_MAX_MEMBERS_PER_CHANNEL = env_int("RELAY_MAX_MEMBERS_PER_CHANNEL", DEFAULT_MAX_MEMBERS_PER_CHANNEL, minimum=1)

# ── Connection tokens ────────────────────────────────────────────────────────
# The longest a connection token may live (exp - iat), minted by POST /v1/tokens or by a
# tenant's backend: a token is a bearer credential carried in a URL, good until it expires.
DEFAULT_MAX_TOKEN_TTL_S = 86_400
RELAY_MAX_TOKEN_TTL_S = env_int("RELAY_MAX_TOKEN_TTL_S", DEFAULT_MAX_TOKEN_TTL_S, minimum=1)
# Tokens one API key may mint a second through POST /v1/tokens, across every instance (counted
# in RELAY_REDIS_URL); past it, 429 with Retry-After.
DEFAULT_RATE_TOKENS_PER_S = 100
RELAY_RATE_TOKENS_PER_S = env_int("RELAY_RATE_TOKENS_PER_S", DEFAULT_RATE_TOKENS_PER_S, minimum=1)

# ── Metrics ──────────────────────────────────────────────────────────────────
# The bearer token a Prometheus scrape of /metrics must send; unset, only loopback clients may
# read it (relay/health.py).
RELAY_METRICS_TOKEN = env_str("RELAY_METRICS_TOKEN")

# ── Agents (docs/contract.md, 5. Agents) ────────────────────────────────────
DEFAULT_AGENT_TTL_MS = 30_000
RELAY_AGENT_TTL_MS = env_int("RELAY_AGENT_TTL_MS", DEFAULT_AGENT_TTL_MS, minimum=1)
RELAY_AGENT_SWEEP_MS = env_int("RELAY_AGENT_SWEEP_MS", max(1, RELAY_AGENT_TTL_MS // 3), minimum=1)
# Agent registrations one identity may hold: each is a row every sweep and listing reads, so one
# identity registering without end would slow them for the whole tenant.
DEFAULT_MAX_AGENTS_PER_USER = 100
RELAY_MAX_AGENTS_PER_USER = env_int("RELAY_MAX_AGENTS_PER_USER", DEFAULT_MAX_AGENTS_PER_USER, minimum=1)

# ── Webhooks (docs/webhooks.md) ──────────────────────────────────────────────
DEFAULT_WEBHOOK_TIMEOUT_MS = 10_000
DEFAULT_WEBHOOK_RETRY_S = 86_400
# How long one delivery attempt may take before it counts as failed.
RELAY_WEBHOOK_TIMEOUT_MS = env_int("RELAY_WEBHOOK_TIMEOUT_MS", DEFAULT_WEBHOOK_TIMEOUT_MS, minimum=1)
# How long a failing receiver is retried (from the event) before its delivery is given up.
RELAY_WEBHOOK_RETRY_S = env_int("RELAY_WEBHOOK_RETRY_S", DEFAULT_WEBHOOK_RETRY_S, minimum=1)
# The first retry's delay; each later one doubles it (with jitter), up to an hour.
RELAY_WEBHOOK_BACKOFF_MS = env_int("RELAY_WEBHOOK_BACKOFF_MS", 1_000, minimum=1)
# How long a presence event may sit read but unacknowledged by an instance (which then presumably
# died) before another instance claims it from the stream.
RELAY_WEBHOOK_CLAIM_MS = env_int("RELAY_WEBHOOK_CLAIM_MS", 30_000, minimum=1)
# Loopback, private and link-local receivers are refused unless this is on (`make run`, tests):
# otherwise a tenant could make Relay POST into the operator's own network.
RELAY_WEBHOOK_ALLOW_PRIVATE = env_bool("RELAY_WEBHOOK_ALLOW_PRIVATE", False)
# Each instance consumes the streams and delivers (webhooks/worker.py). Not an operator's switch:
# the in-process test suite turns it off, its tests start a worker where they need one.
RELAY_WEBHOOK_WORKER = True

# ── Demo client and first-run data (`make run`) ──────────────────────────────
# Turns on the demo sign-in at / (also on under DEBUG) and, in `setupdemo`, the
# prompt-free `admin` superuser. Never on in a deployment: the sign-in mints a
# token for any user of the `local` environment without a password.
RELAY_DEMO = env_bool("RELAY_DEMO", False)

# ── Logging ──────────────────────────────────────────────────────────────────
RELAY_LOG_FORMAT = env_choice("RELAY_LOG_FORMAT", "json", ("json", "console"))
RELAY_LOG_LEVEL = env_choice("RELAY_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "relay.logging.JsonFormatter"},
        "console": {"()": "relay.logging.ConsoleFormatter"},
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": RELAY_LOG_FORMAT,
        },
    },
    "filters": {"abandoned_disconnect": {"()": "relay.logging.AbandonedDisconnectFilter"}},
    "root": {"handlers": ["stderr"], "level": RELAY_LOG_LEVEL},
    "loggers": {
        # Request lines for every API call are noise next to the event vocabulary.
        "django.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        # Never a line per webhook attempt with its URL (whose query may carry the tenant's secret):
        # webhook.delivered / webhook.failed say what matters, without it.
        "aiohttp": {"level": "WARNING"},
        # A client's disconnect is no error (relay/logging.py, AbandonedDisconnectFilter).
        "asyncio": {"filters": ["abandoned_disconnect"]},
    },
}

# ── Static files, i18n, auth ─────────────────────────────────────────────────
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# `python manage.py test` runs the same pytest suite as `make test`.
TEST_RUNNER = "devtools.test_runner.PytestRunner"
