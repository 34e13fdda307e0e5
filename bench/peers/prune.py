"""The peer's prune job: the package's periodic tasks (prune_presences, prune_rooms), every N seconds.

`python -m bench.peers.prune SECONDS`. Celery beat runs them in production; a loop in its own
process does the same here without a broker.
"""

import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.peers.settings")


def main(every: float) -> None:
    import django

    django.setup()
    from channels_presence.models import Room

    while True:
        started = time.monotonic()
        Room.objects.prune_presences()
        Room.objects.prune_rooms()
        time.sleep(max(0.0, every - (time.monotonic() - started)))


if __name__ == "__main__":
    main(float(sys.argv[1]))
