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
        self, code: str, message: str, frame_type: str | None = None, details: dict[str, int] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_type = frame_type
        # More fields of the `error` payload (`retry_after_ms` of `rate_limited`).
        self.details = details or {}


class ApiError(Exception):
    """An HTTP API call is refused with `status` and a JSON error body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class OutputBacklogFull(Exception):
    """A connection's unsent output would pass RELAY_MAX_PENDING_BYTES; `pending_bytes` is what it holds."""

    def __init__(self, pending_bytes: int) -> None:
        super().__init__(pending_bytes)
        self.pending_bytes = pending_bytes
