from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay"
    verbose_name = "Relay: tenants, users and channels"

    def ready(self) -> None:
        from django.conf import settings
        from django.core.signals import request_finished

        # The receivers that carry every membership change to live connections, and that let a
        # new tenant's tokens in at once.
        from relay import membership, tokens  # noqa: F401
        from relay.database import close_request_connections
        from relay.transport import autobahn_debug, inbound_backpressure, pending_output, websocket_options

        # Before Daphne builds its WebSocket factory and protocols, when this process is Daphne.
        websocket_options.install()
        autobahn_debug.install()
        pending_output.install(settings.RELAY_MAX_PENDING_BYTES)
        inbound_backpressure.install()
        request_finished.connect(close_request_connections, dispatch_uid="relay.close_request_connections")
