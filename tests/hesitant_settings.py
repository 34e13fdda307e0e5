"""Relay's settings plus tests/hesitant, for a live instance whose first grace check waits between its reads."""

from relay.settings import *  # noqa: F403
from relay.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.hesitant"]
