"""`manage.py rotatesecret ENVIRONMENT`: a new token signing secret; every open connection of it closes."""

import json
import uuid

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from relay.models import Environment
from relay.reconcile import rotate_secret


class Command(BaseCommand):
    help = (
        "Rotate an environment's token signing secret (by name or id): tokens signed with the old one are "
        "refused, and its open connections on every instance close with 4401 within one refresh interval. "
        "Prints the environment and the time of the rotation as JSON, never a secret."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("environment", help="the environment's name or id")

    def handle(self, *args: object, environment: str, **options: object) -> None:
        found = self.find(environment)
        with transaction.atomic():
            rotate_secret(found)
        self.stdout.write(
            json.dumps(
                {"environment": str(found.id), "name": found.name, "rotated_at": found.secret_rotated_at.isoformat()}
            )
        )

    def find(self, given: str) -> Environment:
        """The environment named `given`, or whose id it is; CommandError when none."""
        try:
            by_id = Environment.objects.filter(id=uuid.UUID(given)).first()
        except ValueError:
            by_id = None
        found = by_id or Environment.objects.filter(name=given).first()
        if found is None:
            raise CommandError(f"no environment named or with the id {given!r}")
        return found
