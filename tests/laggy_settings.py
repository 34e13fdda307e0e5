"""Relay's settings plus tests/laggy, for a live instance whose reconciliation reads arrive late."""

from relay.settings import *  # noqa: F403
from relay.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.laggy"]
