"""`manage.py setupdemo`: on an empty database, a local default environment to try Relay with."""

import json

from django.core.management.base import BaseCommand
from django.db import transaction

from relay.models import ApiKey, Channel, Environment, Membership, User

DEFAULT_ENVIRONMENT = "local"
DEMO_USERS = [("linh", "Linh"), ("tuan", "Tuan"), ("mai", "Mai"), ("an", "An")]
DEMO_CHANNELS = [
    ("general", "public", ["linh", "tuan", "mai", "an"]),
    ("fleet", "private", ["linh", "tuan"]),
    ("ops", "private", ["mai", "an"]),
]


class Command(BaseCommand):
    help = "Create the local default environment with demo users and channels, only when none exists."

    def handle(self, *args: object, **options: object) -> None:
        if Environment.objects.exists():
            environment = Environment.objects.filter(name=DEFAULT_ENVIRONMENT).first()
            if environment is not None:
                self.stdout.write(f"relay: environment {DEFAULT_ENVIRONMENT!r} ({environment.id}) already set up")
            return
        with transaction.atomic():
            environment = Environment.objects.create(name=DEFAULT_ENVIRONMENT)
            _, secret = ApiKey.issue(environment, label="created by make run")
            users = {
                uid: User.objects.create(environment=environment, external_id=uid, name=name)
                for uid, name in DEMO_USERS
            }
            for name, kind, members in DEMO_CHANNELS:
                channel = Channel.objects.create(environment=environment, name=name, type=kind)
                Membership.objects.bulk_create(Membership(channel=channel, user=users[uid]) for uid in members)
        self.stdout.write(
            "relay: created the local environment with users "
            + ", ".join(uid for uid, _ in DEMO_USERS)
            + "; its API key is shown once:"
        )
        self.stdout.write(json.dumps({"environment": str(environment.id), "name": environment.name, "api_key": secret}))
