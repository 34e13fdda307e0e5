"""Relay's settings plus tests/faulty, for live instances whose handlers must fail (tests/test_connection_end.py)."""

from relay.settings import *  # noqa: F403
from relay.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.faulty"]
