"""Relay's settings for the suite: with DEBUG off, as deployed, so the suite brings a SECRET_KEY.

Set in the environment before relay.settings reads it, so every process the suite starts (live
instances, commands) inherits the same one.
"""

import os
import secrets

os.environ.setdefault("SECRET_KEY", "tests-" + secrets.token_urlsafe(48))

from relay.settings import *  # noqa: F403
