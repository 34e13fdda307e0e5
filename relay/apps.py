from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay"
    verbose_name = "Relay: tenants, users and channels"

    def ready(self) -> None:
        # Registers the message frame, event and connection hooks (relay.registry).
        from relay import chat  # noqa: F401
