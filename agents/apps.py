from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        """Plug the agent families and the sweeper into every connection: this app owns them alone."""
        from agents import handlers  # noqa: F401  (importing registers register/heartbeat/deregister)
        from agents.sweeper import SweepOnFirstConnection
        from relay import registry

        registry.extension(SweepOnFirstConnection())
