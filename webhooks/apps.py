from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks: events to the application's backend"

    def ready(self) -> None:
        # The receivers that write each database-decided event into the outbox, in the
        # transaction of the change itself.
        from webhooks import outbox, worker  # noqa: F401

        worker.stop_on_shutdown()
