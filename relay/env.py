"""Strict readers for settings that come from environment variables.

A bad value stops start-up with a message naming the variable and what it accepts,
rather than surfacing later as a confusing failure deep inside a connection.
"""

import os
import re

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    """Return the variable as a string, or the default when unset or empty."""
    value = os.environ.get(name, "")
    return value if value != "" else default


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """Return the variable as an integer no smaller than `minimum`."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_bool(name: str, default: bool) -> bool:
    """Return the variable as a boolean (1/0, true/false, yes/no, on/off)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Return the variable when it is one of `choices`."""
    raw = os.environ.get(name, "").strip() or default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}; got {raw!r}")
    return raw


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list of non-empty items."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def check_redis_url(name: str, url: str) -> str:
    """Return `url` when it is a redis:// or rediss:// URL."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"{name} must be a redis://, rediss:// or unix:// URL; got {url!r}")
    return url


# Django's own deployment check (security.W009) asks for this much, and for variety.
MIN_SECRET_KEY_LENGTH = 50
MIN_SECRET_KEY_CHARACTERS = 5


def check_secret_key(name: str, value: str | None, *, development_default: str, debug: bool) -> str:
    """Return `value`, unless DEBUG is off and it is the development default, empty or short."""
    if debug:
        return value or development_default
    if not value or value == development_default:
        raise ImproperlyConfigured(
            f"{name} is unset or the development default and DEBUG is off: set {name} to a random string "
            f"of at least {MIN_SECRET_KEY_LENGTH} characters "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    if len(value) < MIN_SECRET_KEY_LENGTH or len(set(value)) < MIN_SECRET_KEY_CHARACTERS:
        raise ImproperlyConfigured(
            f"{name} is too short or too plain for DEBUG off: it needs at least {MIN_SECRET_KEY_LENGTH} "
            f"characters, {MIN_SECRET_KEY_CHARACTERS} of them different; got {len(value)} characters"
        )
    return value


def env_hosts(name: str) -> list[tuple[str, int]]:
    """Return a comma-separated list of `host:port` (empty when unset)."""
    hosts = []
    for item in env_list(name, []):
        host, colon, port = item.rpartition(":")
        # A host name or an IPv4 address, or an IPv6 one in brackets: never a URL.
        found = _HOST.fullmatch(host)
        if not colon or not found or not port.isdigit() or not 0 < int(port) < 65536:
            raise ImproperlyConfigured(f"{name} must be comma-separated host:port pairs; got {item!r}")
        hosts.append((found["name"] or found["ipv6"], int(port)))
    return hosts


_HOST = re.compile(r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)|\[(?P<ipv6>[0-9A-Fa-f:.]+)\]")


def env_name(name: str, default: str) -> str:
    """Return the variable as one word: letters, digits and `-_.` only."""
    raw = os.environ.get(name, "").strip() or default
    if not all(char.isalnum() or char in "-_." for char in raw):
        raise ImproperlyConfigured(f"{name} must be letters, digits, '-', '_' or '.'; got {raw!r}")
    return raw
