"""`manage.py createenvironment NAME`: a tenant and its first API key, printed once as JSON."""

import json

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from relay.models import ApiKey, Environment


class Command(BaseCommand):
    help = "Create an environment (tenant) and print its id and a new API key as JSON on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the environment's name (unique, 1-128 characters)")

    def handle(self, *args: object, name: str, **options: object) -> None:
        name = name.strip()
        if not 1 <= len(name) <= 128:
            raise CommandError("NAME must be 1-128 characters")
        if Environment.objects.filter(name=name).exists():
            raise CommandError(f"an environment named {name!r} already exists")
        with transaction.atomic():
            environment = Environment.objects.create(name=name)
            _, secret = ApiKey.issue(environment, label="created by createenvironment")
        self.stdout.write(json.dumps({"environment": str(environment.id), "name": environment.name, "api_key": secret}))
