"""Settings come from the environment through strict helpers; defaults are the contract's."""

import json
import re
import secrets
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from relay import settings as relay_settings
from relay.env import env_bool, env_int


def test_env_int_reads_a_number_and_names_the_variable_when_it_is_not_one(monkeypatch):
    monkeypatch.setenv("RELAY_SOMETHING_MS", "250")
    assert env_int("RELAY_SOMETHING_MS", 1) == 250
    monkeypatch.setenv("RELAY_SOMETHING_MS", "soon")
    with pytest.raises(ImproperlyConfigured, match="RELAY_SOMETHING_MS must be an integer"):
        env_int("RELAY_SOMETHING_MS", 1)


def test_env_int_refuses_values_below_the_minimum(monkeypatch):
    monkeypatch.setenv("RELAY_SOMETHING_MS", "0")
    with pytest.raises(ImproperlyConfigured, match="RELAY_SOMETHING_MS must be at least 1"):
        env_int("RELAY_SOMETHING_MS", 5, minimum=1)


def test_env_bool_accepts_the_usual_spellings_and_refuses_others(monkeypatch):
    monkeypatch.setenv("DEBUG", "yes")
    assert env_bool("DEBUG", False) is True
    monkeypatch.setenv("DEBUG", "off")
    assert env_bool("DEBUG", True) is False
    monkeypatch.setenv("DEBUG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="DEBUG must be one of"):
        env_bool("DEBUG", False)


# A deployment's: DEBUG off, a key of its own.
DEPLOYED = {
    "DJANGO_SETTINGS_MODULE": "relay.settings",
    "PATH": "/usr/bin:/bin",
    "SECRET_KEY": secrets.token_urlsafe(50),
}


def _start_up(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**DEPLOYED, **env},
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )


def _settings_of(*names: str, **env: str) -> dict:
    """The settings Django ends up with in a process started with `env` (and nothing else set)."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, django; django.setup(); from django.conf import settings; "
            "print(json.dumps({name: getattr(settings, name) for name in sys.argv[1:]}))",
            *names,
        ],
        env={**DEPLOYED, **env},
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )
    assert probe.returncode == 0, probe.stderr
    return json.loads(probe.stdout)


def test_an_unconfigured_deployment_runs_on_the_contracts_defaults():
    assert _settings_of(
        "RELAY_PRESENCE_GRACE_MS",
        "RELAY_PRESENCE_TTL_MS",
        "RELAY_PRESENCE_REFRESH_MS",
        "RELAY_PRESENCE_MARGIN_MS",
        "RELAY_MAX_CONNECTIONS_PER_USER",
        "RELAY_AGENT_TTL_MS",
        "RELAY_AGENT_SWEEP_MS",
        "RELAY_MAX_PENDING_BYTES",
    ) == {
        "RELAY_PRESENCE_GRACE_MS": 30_000,
        "RELAY_PRESENCE_TTL_MS": 30_000,
        "RELAY_PRESENCE_REFRESH_MS": 10_000,
        "RELAY_PRESENCE_MARGIN_MS": 1_000,
        "RELAY_MAX_CONNECTIONS_PER_USER": 5,
        "RELAY_AGENT_TTL_MS": 30_000,
        "RELAY_AGENT_SWEEP_MS": 10_000,
        "RELAY_MAX_PENDING_BYTES": 4 * 1024 * 1024,
    }


def test_the_environment_overrides_each_default():
    assert _settings_of(
        "RELAY_PRESENCE_GRACE_MS", "RELAY_AGENT_SWEEP_MS", RELAY_PRESENCE_GRACE_MS="700", RELAY_AGENT_TTL_MS="900"
    ) == {"RELAY_PRESENCE_GRACE_MS": 700, "RELAY_AGENT_SWEEP_MS": 300}


def test_a_bad_value_stops_start_up_naming_the_variable():
    assert _start_up(RELAY_PRESENCE_GRACE_MS="300").returncode == 0
    failed = _start_up(RELAY_PRESENCE_GRACE_MS="thirty seconds")
    assert failed.returncode != 0
    assert "RELAY_PRESENCE_GRACE_MS must be an integer" in failed.stderr


def test_a_refresh_no_faster_than_the_ttl_stops_start_up():
    assert _start_up(RELAY_PRESENCE_REFRESH_MS="100", RELAY_PRESENCE_TTL_MS="300").returncode == 0
    failed = _start_up(RELAY_PRESENCE_REFRESH_MS="300", RELAY_PRESENCE_TTL_MS="300")
    assert "RELAY_PRESENCE_REFRESH_MS must be well inside RELAY_PRESENCE_TTL_MS" in failed.stderr


def test_a_redis_url_that_is_not_one_stops_start_up():
    failed = _start_up(RELAY_REDIS_URL="localhost:6379")
    assert "RELAY_REDIS_URL must be a redis://" in failed.stderr
    assert _start_up(RELAY_REDIS_URL="redis://127.0.0.1:1/0").returncode == 0


def test_cluster_nodes_are_read_strictly_and_carry_presence_unless_it_has_a_redis_of_its_own():
    presence = {"RELAY_PRESENCE_REDIS_URL": "redis://127.0.0.1:1/0"}
    for bad in ("127.0.0.1", "127.0.0.1:port", "127.0.0.1:70000", ":7000", "redis://127.0.0.1:7000"):
        failed = _start_up(RELAY_REDIS_CLUSTER_NODES=bad, **presence)
        assert failed.returncode != 0
        assert "RELAY_REDIS_CLUSTER_NODES must be comma-separated host:port pairs" in failed.stderr
    nodes = "127.0.0.1:7000, 10.0.0.2:7001"
    failed = _start_up(RELAY_REDIS_CLUSTER_NODES=nodes, RELAY_REDIS_SENTINELS="127.0.0.1:26379", **presence)
    assert "RELAY_REDIS_CLUSTER_NODES and RELAY_REDIS_SENTINELS are both set" in failed.stderr
    shown = "print(settings.CHANNEL_LAYERS['default']); print('presence', settings.RELAY_PRESENCE_CLUSTER_NODES)"
    for extra, on_cluster in (({}, "[('127.0.0.1', 7000), ('10.0.0.2', 7001)]"), (presence, "[]")):
        probe = subprocess.run(
            [sys.executable, "-c", f"from django.conf import settings; {shown}"],
            env={**DEPLOYED, "RELAY_REDIS_CLUSTER_NODES": nodes, **extra},
            capture_output=True,
            text=True,
            cwd=settings.BASE_DIR,
        )
        assert probe.returncode == 0, probe.stderr
        assert "relay.transport.cluster.RelayClusterChannelLayer" in probe.stdout
        assert "[['127.0.0.1', 7000], ['10.0.0.2', 7001]]" in probe.stdout
        assert f"presence {on_cluster}" in probe.stdout


def test_sqlite_runs_in_wal_mode_with_immediate_transactions(tmp_path):
    # In a child process with its own SQLite file, so this holds whichever database the suite runs on.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.db import connection; c = connection.cursor(); "
            "print(c.execute('PRAGMA journal_mode').fetchone()[0], connection.transaction_mode)",
        ],
        env={
            **DEPLOYED,
            "DATABASE_URL": f"sqlite:///{tmp_path / 'wal.sqlite3'}",
        },
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )
    assert probe.stdout.split() == ["wal", "IMMEDIATE"], probe.stderr


def test_database_url_selects_postgresql():
    probe = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"],
        env={
            **DEPLOYED,
            "DATABASE_URL": "postgres://relay:secret@db.internal:5432/relay",
        },
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )
    assert probe.stdout.strip() == "django.db.backends.postgresql"


def test_the_limit_cannot_be_set_below_one_largest_frame():
    assert _start_up(RELAY_MAX_PENDING_BYTES="65536").returncode == 0
    failed = _start_up(RELAY_MAX_PENDING_BYTES="65535")
    assert "RELAY_MAX_PENDING_BYTES must be at least 65536" in failed.stderr


@pytest.mark.parametrize(
    "key, says",
    [
        (relay_settings.DEVELOPMENT_SECRET_KEY, "SECRET_KEY is unset or the development default"),
        ("", "SECRET_KEY is unset or the development default"),
        ("x" * 60, "SECRET_KEY is too short or too plain"),
        ("short-but-varied-0123", "SECRET_KEY is too short or too plain"),
    ],
)
def test_with_debug_off_an_unsafe_secret_key_stops_start_up_naming_it(key, says):
    assert _start_up().returncode == 0
    failed = _start_up(SECRET_KEY=key)
    assert failed.returncode != 0
    assert says in failed.stderr


def test_with_debug_on_the_development_key_is_allowed():
    assert _start_up(DEBUG="1", SECRET_KEY="").returncode == 0
    assert _start_up(DEBUG="0", SECRET_KEY="").returncode != 0


def _check_deploy(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env={**DEPLOYED, "ALLOWED_HOSTS": "relay.example.com", **env},
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )


def test_check_deploy_passes_under_the_readmes_production_settings():
    # The README's "Running several instances" block: a key, the hosts, and HTTPS.
    passed = _check_deploy(RELAY_HTTPS="1")
    assert passed.returncode == 0, passed.stderr
    assert "no issues" in passed.stdout
    plain = _check_deploy()
    assert plain.returncode != 0
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= set(
        re.findall(r"security\.W\d+", plain.stderr)
    )


def test_https_settings_follow_the_environment():
    probe = (
        "from django.conf import settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER)"
    )

    def read(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={**DEPLOYED, **env},
            capture_output=True,
            text=True,
            cwd=settings.BASE_DIR,
        )
        return done.stdout.strip() or done.stderr

    assert read() == "False False 0 None"
    assert read(RELAY_HTTPS="1") == "True True 31536000 None"
    assert read(RELAY_HTTPS="1", RELAY_HSTS_SECONDS="0", RELAY_TRUST_X_FORWARDED_PROTO="1") == (
        "True True 0 ('HTTP_X_FORWARDED_PROTO', 'https')"
    )


def test_a_cluster_takes_the_user_password_and_tls_of_relay_redis_url():
    from relay.redis_clients import cluster_options

    assert cluster_options("rediss://relay:s3cret@ignored.example:6380/0") == {
        "username": "relay",
        "password": "s3cret",
        "ssl": True,
    }
    assert cluster_options("redis://:s3cret@ignored.example:6379/0") == {"password": "s3cret"}
    assert cluster_options("redis://127.0.0.1:6379/0") == {}
