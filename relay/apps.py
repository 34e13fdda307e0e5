from django.apps import AppConfig


class RelayConfig(AppConfig):
    name = "relay"
    verbose_name = "Relay: tenants, users and channels"
