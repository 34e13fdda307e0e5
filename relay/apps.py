from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay"
    verbose_name = "Relay: tenants, users and channels"

    def ready(self) -> None:
        # chat registers the message frame, event and connection hooks (relay.registry);
        # membership connects the receivers that carry every membership change to live connections.
        from django.conf import settings

        from relay import chat, membership  # noqa: F401
        from relay.close_handshake import install
        from relay.transport import fail_by_close, pending_output

        # Before Daphne builds its WebSocket factory, when this process is Daphne.
        install()
        fail_by_close.install()
        pending_output.install(settings.RELAY_MAX_PENDING_BYTES)
