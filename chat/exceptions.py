"""The chat app's exceptions, one line each, carrying what a caller needs."""


class NotAMember(Exception):
    """The user is not a member of `channel_id` (or it is another tenant's, or unknown)."""

    def __init__(self, channel_id: str) -> None:
        super().__init__(channel_id)
        self.channel_id = channel_id
