"""Where a webhook may go: http(s) URLs whose host resolves to public addresses only.

Checked when an endpoint is created, and at every connection by the delivery client's resolver
(`PublicResolver`): the addresses it checked are the ones the client connects to, so a name that
answers a public address to one lookup and a private one to the next (DNS rebinding) cannot slip
a connection inward. RELAY_WEBHOOK_ALLOW_PRIVATE lifts the address rule (a receiver on the same
machine or network: `make run`, the tests).
"""

import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from django.conf import settings


class RefusedUrl(ValueError):
    """A URL no delivery may go to; the message says why, without echoing the URL."""


class RefusedAddress(OSError):
    """A name that resolved to an address no delivery may connect to (an OSError: a failed lookup to aiohttp)."""


REFUSED_ADDRESS = (
    "the url's host resolves to a loopback, private or link-local address "
    "(allowed only with RELAY_WEBHOOK_ALLOW_PRIVATE=1)"
)


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
    """Raise RefusedUrl unless `url` is http(s) and (unless allowed) its host resolves to public addresses only.

    An endpoint's check when it is created; deliveries are checked as they connect (below).
    """
    host = check_scheme(url)
    if settings.RELAY_WEBHOOK_ALLOW_PRIVATE:
        return
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise RefusedUrl("the url's host does not resolve") from None
    if any(_forbidden(_address(info[4][0])) for info in infos):
        raise RefusedUrl(REFUSED_ADDRESS)


def check_literal(url: str) -> None:
    """Raise RefusedUrl unless `url` is http(s) and (unless allowed) its host, if an IP address, is public.

    An attempt's check: aiohttp connects to an address in the URL without asking its resolver,
    and a name is checked by `PublicResolver` as the connection resolves it.
    """
    host = check_scheme(url)
    if settings.RELAY_WEBHOOK_ALLOW_PRIVATE:
        return
    try:
        address = _address(host)
    except ValueError:
        return
    if _forbidden(address):
        raise RefusedUrl(REFUSED_ADDRESS)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # A scoped IPv6 address (fe80::1%eth0) is judged by its address.
    return ipaddress.ip_address(text.split("%", 1)[0])


class PublicResolver(AbstractResolver):
    """aiohttp's resolver, refusing a name with any address a webhook may not reach.

    The delivery client connects only to the addresses this returns, and TLS still verifies the
    certificate against the URL's name (aiohttp passes it as the server name), so what was
    checked is what is connected to.
    """

    def __init__(self) -> None:
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The name's addresses, or RefusedAddress when one of them is not public (unless allowed)."""
        answers = await self._resolver.resolve(host, port, family)
        if not settings.RELAY_WEBHOOK_ALLOW_PRIVATE and any(_forbidden(_address(a["host"])) for a in answers):
            raise RefusedAddress(REFUSED_ADDRESS)
        return answers

    async def close(self) -> None:
        await self._resolver.close()
