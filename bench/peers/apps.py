from django.apps import AppConfig


class PeersConfig(AppConfig):
    """Connects the peer's receiver wherever Django starts with the peer's settings."""

    name = "bench.peers"
    label = "bench_peers"

    def ready(self) -> None:
        from bench.peers import receivers  # noqa: F401
