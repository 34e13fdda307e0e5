from django.apps import AppConfig


class PresenceConfig(AppConfig):
    name = "presence"
    verbose_name = "Presence"

    def ready(self) -> None:
        from presence import extension, shutdown
        from relay import registry

        registry.extension(extension.PresenceExtension())
        shutdown.install()
