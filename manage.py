#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    """Run administrative tasks."""
    # `test` runs the pytest suite, which brings its own SECRET_KEY (tests/settings.py).
    default = "tests.settings" if sys.argv[1:2] == ["test"] else "relay.settings"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", default)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
