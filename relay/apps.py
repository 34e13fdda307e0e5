from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay"
    verbose_name = "Relay: tenants, users and channels"

    def ready(self) -> None:
        # The receivers that carry every membership change to live connections.
        from relay import membership  # noqa: F401
        from relay.transport import close_handshake

        # Before Daphne builds its WebSocket factory, when this process is Daphne.
        close_handshake.install()
