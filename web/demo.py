"""The demo's world: the `local` environment that `setupdemo` creates and the sign-in serves."""

from django.conf import settings

from relay.models import Environment

DEMO_ENVIRONMENT = "local"


def demo_enabled() -> bool:
    """Whether the passwordless demo sign-in is on (DEBUG or RELAY_DEMO)."""
    return bool(settings.DEBUG or settings.RELAY_DEMO)


def demo_environment() -> Environment | None:
    """Return the `local` environment `setupdemo` creates, if it exists."""
    return Environment.objects.filter(name=DEMO_ENVIRONMENT).first()
