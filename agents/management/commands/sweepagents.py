"""`manage.py sweepagents`: one sweep of stale agent registrations, for cron."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.actions import sweep_stale


class Command(BaseCommand):
    help = "Remove agent registrations unseen for longer than RELAY_AGENT_TTL_MS (once; the instances also sweep)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ttl-ms",
            type=int,
            default=None,
            help=f"remove rows unseen for this long (default RELAY_AGENT_TTL_MS = {settings.RELAY_AGENT_TTL_MS})",
        )

    def handle(self, *args: object, ttl_ms: int | None, **options: object) -> None:
        if ttl_ms is not None and ttl_ms < 1:
            raise CommandError(f"--ttl-ms must be at least 1, got {ttl_ms}")
        swept = sweep_stale(ttl_ms=ttl_ms)
        self.stdout.write(f"Removed {len(swept)} stale agent registration(s).")
