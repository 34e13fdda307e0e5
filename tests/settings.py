"""Relay's settings for the suite: with DEBUG off, as deployed, so the suite brings a SECRET_KEY.

Set in the environment before relay.settings reads it, so every process the suite starts (live
instances, commands) inherits the same one.
"""

import os
import secrets

os.environ.setdefault("SECRET_KEY", "tests-" + secrets.token_urlsafe(48))
# The suite's receivers listen on 127.0.0.1; the refusal itself is tested with the setting off.
os.environ.setdefault("RELAY_WEBHOOK_ALLOW_PRIVATE", "1")

from relay.settings import *  # noqa: F403

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":  # noqa: F405
    # channels.testing's communicators switch off Channels' per-call connection cleanup, so the
    # in-process tests would never hand pooled connections back. Unpooled, a finished test's
    # worker threads take theirs with them. Live instances run relay.settings, with the pool.
    DATABASES["default"]["OPTIONS"].pop("pool")  # noqa: F405

# The webhook worker runs in live instances; in-process tests start one where they need it.
RELAY_WEBHOOK_WORKER = False
