"""Relay's exceptions, one line each, carrying what a caller needs."""


class InvalidToken(Exception):
    """The connection token is missing, forged, expired, malformed or names no known user."""


class ConnectionRefused(Exception):
    """An extension refuses a WebSocket before it is acknowledged; `code` is the close code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class FrameError(Exception):
    """A client frame is refused; answered with an `error` frame (naming `frame_type` if known) and the socket kept."""

    def __init__(
        self, code: str, message: str, frame_type: str | None = None, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_type = frame_type
        # With `rate_limited`: when the next such frame would be taken.
        self.retry_after_ms = retry_after_ms


class ApiError(Exception):
    """An HTTP API call is refused with `status`, a JSON error body and any `headers` (Retry-After)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


class LimitReached(Exception):
    """A membership would pass RELAY_MAX_CHANNELS_PER_USER or RELAY_MAX_MEMBERS_PER_CHANNEL; `setting` names which."""

    def __init__(self, setting: str, limit: int) -> None:
        super().__init__(f"{setting} ({limit}) reached")
        self.setting = setting
        self.limit = limit


class OutputBacklogFull(Exception):
    """A connection's unsent output would pass RELAY_MAX_PENDING_BYTES; `pending_bytes` is what it holds."""

    def __init__(self, pending_bytes: int) -> None:
        super().__init__(pending_bytes)
        self.pending_bytes = pending_bytes
