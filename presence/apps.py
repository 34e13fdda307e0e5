from django.apps import AppConfig


class PresenceConfig(AppConfig):
    name = "presence"
    verbose_name = "Presence"

    def ready(self) -> None:
        from presence import announce, extension, handlers, shutdown
        from relay import membership, registry

        registry.extension(handlers.RichPresence())
        registry.extension(extension.PresenceExtension())
        membership.member_added.connect(announce.member_added, dispatch_uid="presence.announce")
        membership.member_removed.connect(announce.member_removed, dispatch_uid="presence.forget")
        shutdown.install()
