"""Everything the client raises, in one place.

This module imports nothing of the package: `events` raises `ProtocolError` from here, and the
refusals below keep the `error` frame that answered (an `events.Error`) by the fields they read.
"""

from typing import Protocol


class ErrorFrame(Protocol):
    """What a refusal reads of the `error` frame that answered (`relay_client.events.Error`)."""

    @property
    def code(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def type(self) -> str | None: ...


class RelayError(Exception):
    """The base of every error this package raises."""


class ConnectFailed(RelayError):
    """`connect()` could not open the first connection (network, handshake, or no ack and snapshot in time)."""


class ProtocolError(RelayError):
    """The server sent something the contract does not describe."""


class ClientClosed(RelayError):
    """The client was closed: nothing more is sent or received."""


class Refused(RelayError):
    """The server closed the connection with a refusal `code`, and the token source gave no new token."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code


class Unauthorized(Refused):
    """Closed with 4401: a missing, forged, expired or revoked token."""

    def __init__(self, code: int = 4401) -> None:
        super().__init__(code, "the server refused the token")


class TooManyConnections(Refused):
    """Closed with 4429: the user holds the most connections the server allows."""

    def __init__(self, code: int = 4429) -> None:
        super().__init__(code, "the user holds too many connections")


class UserChanged(RelayError):
    """A reconnect was acknowledged for another user than the first connection: one client is one user."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"the token callable gave a token for {got!r}; this client connected as {expected!r}")
        self.expected, self.got = expected, got


class IdentityMismatch(RelayError):
    """An agent's identity is not the connected user (the server binds an instance to the token's user)."""

    def __init__(self, identity: str, user: str | None) -> None:
        super().__init__(f"agent identity {identity!r} is not the connected user {user!r}")
        self.identity, self.user = identity, user


class FrameRefused(RelayError):
    """The server answered a request with an `error` frame (kept in `error`)."""

    def __init__(self, error: ErrorFrame) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error


class SendRefused(FrameRefused):
    """The server refused a `message.send`; `unavailable` may be sent again with the same `idem_key`."""

    def __init__(self, error: ErrorFrame, idem_key: str) -> None:
        super().__init__(error)
        self.idem_key = idem_key


class AgentRefused(FrameRefused):
    """The server refused a `register` or `deregister` (e.g. `instance_owned`)."""

    def __init__(self, error: ErrorFrame, instance: str) -> None:
        super().__init__(error)
        self.instance = instance


class HistoryUnavailable(RelayError):
    """The history endpoint could not be read; `status` is the HTTP status, None when none came back."""

    def __init__(self, status: int | None, reason: str) -> None:
        super().__init__(f"history: {status or 'no answer'}: {reason}")
        self.status = status
