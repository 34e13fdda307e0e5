"""Reading a channel's history over HTTP, with the connection token: how the client fills a gap.

urllib in a worker thread keeps the package to the standard library and websockets; a page is one
short request, made only when a seq skips or a channel is new to the client.
"""

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote

from relay_client.events import MessageCreated, from_payload
from relay_client.exceptions import HistoryUnavailable, ProtocolError

# The endpoint's largest page.
PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Messages after a seq, in seq order; `next_after` is None once the page reached the newest."""

    messages: tuple[MessageCreated, ...]
    next_after: int | None


# Seconds a history request may take; the fallback (a reconnect and resume) covers a slow server.
TIMEOUT = 10.0
# The most one message can take in a page: 16,384 characters of text (docs/contract.md), each at
# most 12 bytes as escaped JSON (a surrogate pair), and its other fields. A page larger than its
# messages can be is refused unread, so a broken or hostile server cannot fill the client's memory.
MESSAGE_BYTES_MAX = 12 * 16_384 + 2_048
PAGE_OVERHEAD_BYTES = 4_096


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a new place to send the connection token to."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


async def read_history(base_url: str, token: str, channel: str, after: int, limit: int = PAGE_SIZE) -> HistoryPage:
    """GET /v1/channels/<channel>/messages?after=&limit= with `Authorization: Bearer <token>`."""
    return await asyncio.to_thread(_read, base_url, token, channel, after, limit)


def _read(base_url: str, token: str, channel: str, after: int, limit: int) -> HistoryPage:
    url = f"{base_url}/v1/channels/{quote(channel, safe='')}/messages?after={after}&limit={limit}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with _opener.open(request, timeout=TIMEOUT) as response:
            bound = PAGE_OVERHEAD_BYTES + limit * MESSAGE_BYTES_MAX
            raw = response.read(bound + 1)
        if len(raw) > bound:
            raise HistoryUnavailable(200, "the page is larger than its messages can be")
        body = json.loads(raw)
    except urllib.error.HTTPError as error:
        raise HistoryUnavailable(error.code, error.reason) from None
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise HistoryUnavailable(None, type(error).__name__) from None
    try:
        return _page(body)
    except ProtocolError as error:
        raise HistoryUnavailable(200, str(error)) from None


def _page(body: object) -> HistoryPage:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ProtocolError("history: not a {channel, messages, next_after} object")
    next_after = body.get("next_after")
    if next_after is not None and (not isinstance(next_after, int) or isinstance(next_after, bool)):
        raise ProtocolError("history: next_after is not a seq")
    messages = tuple(from_payload(MessageCreated, item, "history") for item in body["messages"])
    return HistoryPage(messages=messages, next_after=next_after)
