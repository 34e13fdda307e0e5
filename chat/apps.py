from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        # Registers the message.send frame, the message.created event and the connection hooks;
        # then the signal frame and its relay, on the same groups.
        from chat import handlers, signals  # noqa: F401
