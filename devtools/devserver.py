"""`make run`: an embedded Redis (unless RELAY_REDIS_URL is set), migrations, then Daphne.

With RELAY_REDIS_CLUSTER_NODES set, the channel layer and presence run on that cluster (presence
on a single Redis instead when RELAY_PRESENCE_REDIS_URL names one).

On first start `setupdemo` creates the demo data; once Daphne answers, the URLs to
open (and any secret just created) are printed together, after the start-up noise.
Everything it starts is stopped when it stops: Ctrl-C (SIGINT) or SIGTERM ends
Daphne first, then the embedded Redis.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from devtools.embedded_redis import EmbeddedRedis

BASE_DIR = Path(__file__).resolve().parent.parent
HOST = os.environ.get("RELAY_HOST", "127.0.0.1")
PORT = os.environ.get("RELAY_PORT", "8000")


def manage(*args: str) -> None:
    """Run a manage.py command in a child process and stop on failure."""
    subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], check=True, env=os.environ)


def setup_demo() -> dict:
    """Run `setupdemo`, echo its lines, and return its JSON summary (empty when it printed none)."""
    result = subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), "setupdemo"],
        check=True,
        env=os.environ,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = result.stdout.strip().splitlines()
    summary = {}
    with contextlib.suppress(IndexError, json.JSONDecodeError):
        summary = json.loads(lines[-1])
    if isinstance(summary, dict) and summary:
        # The secrets in it are printed once, in the welcome, not twice.
        lines.pop()
    else:
        summary = {}
    for line in lines:
        print(line, flush=True)
    return summary


def wait_until_serving(daphne: subprocess.Popen, base_url: str, timeout: float = 30.0) -> bool:
    """Wait until /healthz answers; False if Daphne exited or the time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daphne.poll() is None:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{base_url}healthz", timeout=2) as response:
            if response.status == 200:
                return True
        time.sleep(0.1)
    return False


def welcome(base_url: str, summary: dict) -> str:
    """The lines that tell a newcomer what to open, with the secrets created on this start."""
    lines = [
        "",
        f"relay: ready on {base_url}  (Ctrl-C stops everything)",
        f"  demo client  {base_url}   pick a user; open a second window as another one",
        f"  admin        {base_url}admin/",
    ]
    if "admin_password" in summary:
        lines.append(f"               user {summary['admin_user']}, password {summary['admin_password']}  (shown once)")
    else:
        lines.append("               as a superuser: `RELAY_DEMO=1 make run` creates `admin` when there is none")
    if "api_key" in summary:
        lines.append(f"  API key      {summary['api_key']}  for environment {summary['name']!r} (shown once)")
        lines.append(
            f"               curl -X POST {base_url}v1/tokens -H 'Authorization: Bearer {summary['api_key']}' "
            """-d '{"user": "linh"}'"""
        )
    elif summary:
        lines.append(f"  API key      printed on first start; issue another in admin (environment {summary['name']!r})")
    lines.append(f"  metrics      {base_url}metrics")
    return "\n".join(lines) + "\n"


def main() -> int:
    """Set up and serve until interrupted; return the exit status."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
    os.environ.setdefault("RELAY_LOG_FORMAT", "console")
    os.environ.setdefault("DEBUG", "1")
    # A receiver on this machine (docs/webhooks.md's example) is what a first try uses.
    os.environ.setdefault("RELAY_WEBHOOK_ALLOW_PRIVATE", "1")
    redis_server = None
    if not os.environ.get("RELAY_REDIS_URL"):
        redis_server = EmbeddedRedis().start()
        os.environ["RELAY_REDIS_URL"] = redis_server.url
        print(f"relay: embedded Redis on {redis_server.url} (persistence off)", flush=True)
    daphne = None
    try:
        manage("migrate", "--noinput", "-v", "0")
        summary = setup_demo()
        base_url = f"http://{HOST}:{PORT}/"
        daphne = subprocess.Popen(
            [sys.executable, "-m", "relay.serve", "-b", HOST, "-p", PORT, "relay.asgi:application"], env=os.environ
        )
        # Ctrl-C reaches the whole process group; this process waits for Daphne to
        # finish its own shutdown instead of dying first and orphaning it.
        signal.signal(signal.SIGINT, lambda *_: None)
        # SIGTERM is passed on as SIGTERM: a `make run` started in the background
        # inherits SIGINT ignored (POSIX), and Twisted then leaves it ignored.
        signal.signal(signal.SIGTERM, lambda *_: daphne.terminate())
        if wait_until_serving(daphne, base_url):
            print(welcome(base_url, summary), flush=True)
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
