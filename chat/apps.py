from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        # Registers the message.send frame, the message.created event and the connection hooks.
        from chat import handlers  # noqa: F401
