"""`make run`: an embedded Redis (unless RELAY_REDIS_URL is set), migrations, then Daphne.

Everything it starts is stopped when it stops: Ctrl-C (SIGINT) or SIGTERM ends
Daphne first, then the embedded Redis.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

from relay.embedded_redis import EmbeddedRedis

BASE_DIR = Path(__file__).resolve().parent.parent
HOST = os.environ.get("RELAY_HOST", "127.0.0.1")
PORT = os.environ.get("RELAY_PORT", "8000")


def manage(*args: str) -> None:
    """Run a manage.py command in a child process and stop on failure."""
    subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], check=True, env=os.environ)


def main() -> int:
    """Set up and serve until interrupted; return the exit status."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
    os.environ.setdefault("RELAY_LOG_FORMAT", "console")
    os.environ.setdefault("DEBUG", "1")
    redis_server = None
    if not os.environ.get("RELAY_REDIS_URL"):
        redis_server = EmbeddedRedis().start()
        os.environ["RELAY_REDIS_URL"] = redis_server.url
        print(f"relay: embedded Redis on {redis_server.url} (persistence off)", flush=True)
    daphne = None
    try:
        manage("migrate", "--noinput", "-v", "0")
        manage("setupdemo")
        print(f"relay: serving on http://{HOST}:{PORT}/  (Ctrl-C stops everything)", flush=True)
        daphne = subprocess.Popen(
            [sys.executable, "-m", "relay.serve", "-b", HOST, "-p", PORT, "relay.asgi:application"], env=os.environ
        )
        # Ctrl-C reaches the whole process group; this process waits for Daphne to
        # finish its own shutdown instead of dying first and orphaning it.
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: daphne.send_signal(signal.SIGINT))
        return daphne.wait()
    except (subprocess.CalledProcessError, KeyboardInterrupt):
        return 1
    finally:
        if daphne is not None and daphne.poll() is None:
            daphne.terminate()
            daphne.wait(timeout=10)
        if redis_server is not None:
            redis_server.close()
            print("relay: embedded Redis stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
