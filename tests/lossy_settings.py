"""Relay's settings plus tests/lossy, for live instances that never hear a notice (tests/test_reconcile_live.py)."""

from relay.settings import *  # noqa: F403
from relay.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.lossy"]
