"""`manage.py setupdemo`: the first-run data `make run` needs, created once.

On an empty database: a local default environment with demo users and channels,
and its API key printed once. With RELAY_DEMO=1: also a superuser `admin` with a
random password printed once, when there is no superuser yet. The last line is
JSON (`environment`, `name`, and `api_key` / `admin_password` when just created)
so `make run` can print the URLs and secrets to open.
"""

import json
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from relay.models import ApiKey, Channel, Environment, Membership, User
from web.demo import DEMO_ENVIRONMENT

DEMO_USERS = [("linh", "Linh"), ("tuan", "Tuan"), ("mai", "Mai"), ("an", "An")]
DEMO_CHANNELS = [
    ("general", "public", ["linh", "tuan", "mai", "an"]),
    ("fleet", "private", ["linh", "tuan"]),
    ("ops", "private", ["mai", "an"]),
]
ADMIN_USERNAME = "admin"


class Command(BaseCommand):
    help = (
        "Create the local default environment with demo users and channels, only when the database is empty; "
        "with RELAY_DEMO=1 also a superuser 'admin' when none exists."
    )

    def handle(self, *args: object, **options: object) -> None:
        summary: dict[str, str] = {}
        environment = Environment.objects.filter(name=DEMO_ENVIRONMENT).first()
        if environment is None and not Environment.objects.exists():
            environment, summary["api_key"] = self.create_environment()
            self.stdout.write(
                f"relay: created the {DEMO_ENVIRONMENT!r} environment with users "
                + ", ".join(uid for uid, _ in DEMO_USERS)
                + "; its API key is shown once"
            )
        elif environment is not None:
            self.stdout.write(f"relay: environment {DEMO_ENVIRONMENT!r} ({environment.id}) already set up")
        if settings.RELAY_DEMO:
            password = self.create_superuser()
            if password is not None:
                summary["admin_user"] = ADMIN_USERNAME
                summary["admin_password"] = password
                self.stdout.write(f"relay: created the superuser {ADMIN_USERNAME!r}; its password is shown once")
        if environment is not None:
            self.stdout.write(json.dumps({"environment": str(environment.id), "name": environment.name, **summary}))

    def create_environment(self) -> tuple[Environment, str]:
        """Create the demo environment, users and channels; return it and its new API key."""
        with transaction.atomic():
            environment = Environment.objects.create(name=DEMO_ENVIRONMENT)
            _, secret = ApiKey.issue(environment, label="created by make run")
            users = {
                uid: User.objects.create(environment=environment, external_id=uid, name=name)
                for uid, name in DEMO_USERS
            }
            for name, kind, members in DEMO_CHANNELS:
                channel = Channel.objects.create(environment=environment, name=name, type=kind)
                Membership.objects.bulk_create(Membership(channel=channel, user=users[uid]) for uid in members)
        return environment, secret

    def create_superuser(self) -> str | None:
        """Create `admin` with a random password unless a superuser exists; return the password."""
        staff = get_user_model()
        if staff.objects.filter(is_superuser=True).exists():
            return None
        if staff.objects.filter(username=ADMIN_USERNAME).exists():
            # Someone made an ordinary `admin`: promoting it silently would hand it the keys.
            self.stderr.write(f"relay: a non-superuser {ADMIN_USERNAME!r} exists; not creating a superuser")
            return None
        password = secrets.token_urlsafe(12)
        staff.objects.create_superuser(username=ADMIN_USERNAME, email="", password=password)
        return password
