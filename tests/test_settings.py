"""Settings come from the environment through strict helpers; defaults are the contract's."""

import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from relay import settings as relay_settings
from relay.env import env_bool, env_int


def test_the_production_presence_defaults_are_the_contracts():
    assert relay_settings.DEFAULT_PRESENCE_GRACE_MS == 30_000
    assert relay_settings.DEFAULT_PRESENCE_TTL_MS == 30_000
    assert relay_settings.DEFAULT_PRESENCE_REFRESH_MS == 10_000
    assert relay_settings.DEFAULT_PRESENCE_MARGIN_MS == 1_000
    assert relay_settings.DEFAULT_MAX_CONNECTIONS_PER_USER == 5
    assert relay_settings.DEFAULT_AGENT_TTL_MS == 30_000


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


def _start_up(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={"DJANGO_SETTINGS_MODULE": "relay.settings", "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )


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
            "DJANGO_SETTINGS_MODULE": "relay.settings",
            "PATH": "/usr/bin:/bin",
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
            "DJANGO_SETTINGS_MODULE": "relay.settings",
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": "postgres://relay:secret@db.internal:5432/relay",
        },
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )
    assert probe.stdout.strip() == "django.db.backends.postgresql"


def test_the_limit_defaults_to_4_mib_and_cannot_be_set_below_one_largest_frame():
    assert relay_settings.DEFAULT_MAX_PENDING_BYTES == 4 * 1024 * 1024
    assert _start_up(RELAY_MAX_PENDING_BYTES="65536").returncode == 0
    failed = _start_up(RELAY_MAX_PENDING_BYTES="65535")
    assert "RELAY_MAX_PENDING_BYTES must be at least 65536" in failed.stderr
