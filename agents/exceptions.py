"""The agents app's exceptions, one line each, carrying what a caller needs."""


class InstanceOwned(Exception):
    """A `register` names an instance another identity of the environment already owns."""

    def __init__(self, instance: str) -> None:
        super().__init__(f"instance {instance!r} is registered to another identity")
        self.instance = instance


class RegistrationsCapped(Exception):
    """A `register` would give its identity more than RELAY_MAX_AGENTS_PER_USER registrations."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"this identity already holds {limit} registrations (RELAY_MAX_AGENTS_PER_USER)")
        self.limit = limit
