"""Where a webhook may go: http(s) URLs whose host resolves to public addresses only.

Checked when an endpoint is created and again before every attempt, since what a name resolves
to can change after it was accepted. RELAY_WEBHOOK_ALLOW_PRIVATE lifts the address rule (a
receiver on the same machine or network: `make run`, the tests).
"""

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings


class RefusedUrl(ValueError):
    """A URL no delivery may go to; the message says why, without echoing the URL."""


def check_scheme(url: str) -> str:
    """Return the URL's host, or raise RefusedUrl when it is not an http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise RefusedUrl("the url must be http or https")
    if not parts.hostname:
        raise RefusedUrl("the url must name a host")
    if parts.username or parts.password:
        raise RefusedUrl("the url must not carry credentials")
    try:
        parts.port  # noqa: B018  (a port out of range raises here)
    except ValueError:
        raise RefusedUrl("the url's port is invalid") from None
    return parts.hostname


def _forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def check_url(url: str) -> None:
    """Raise RefusedUrl unless `url` is http(s) and (unless allowed) its host resolves to public addresses only."""
    host = check_scheme(url)
    if settings.RELAY_WEBHOOK_ALLOW_PRIVATE:
        return
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise RefusedUrl("the url's host does not resolve") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if _forbidden(address):
            raise RefusedUrl(
                "the url's host resolves to a loopback, private or link-local address "
                "(allowed only with RELAY_WEBHOOK_ALLOW_PRIVATE=1)"
            )
