"""The agents app's exceptions, one line each, carrying what a caller needs."""


class InstanceOwned(Exception):
    """A `register` names an instance another identity of the environment already owns."""

    def __init__(self, instance: str) -> None:
        super().__init__(f"instance {instance!r} is registered to another identity")
        self.instance = instance
