"""The `webhooks` phase of `make bench`: presence transitions delivered to a local receiver.

Two Relay instances, watchers on B and subjects on A (the notify scenario, with the churn
phase's short grace, so each subject is an `online` and an `offline`), and one endpoint that
receives both, at bench/webhook_receiver.py. Three runs, each on fresh users:

- healthy receiver: `webhooks.delivery_p99_ms`, from the transition (the event's timestamp,
  Redis's clock on this machine) to its receipt, and the notify p99 beside it;
- a receiver that holds everything until the whole backlog is in the outbox, then lets go:
  `webhooks.events_per_s`, the sustained delivery rate of that backlog;
- a receiver that holds every request 15 s: the notify p99 again, over the mean of the healthy
  run's and of one more healthy run right after, is `webhooks.presence_p99_ratio_hanging_receiver`
  (a receiver must not slow presence down).
"""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.harness import BASE_DIR, CHURN_TIMINGS, Server, Sizes, World, daphne, open_and_close, run_job, say

EVENTS = ["user.online", "user.offline"]
HANG_S = 15
SUBJECTS_PER_CHANNEL = 20


class Receiver:
    """bench/webhook_receiver.py in its own process, driven over stdin."""

    def __init__(self) -> None:
        from devtools.embedded_redis import free_port

        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.webhook_receiver", str(self.port)],
            cwd=BASE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        json.loads(self.process.stdout.readline())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def receipts(self) -> list[tuple[str, str, float, float]]:
        self.send("dump")
        return [tuple(item) for item in json.loads(self.process.stdout.readline())]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def _listening(server: Server) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
        return "relay_webhook_environments 1.0" in response.read().decode().splitlines()


def _wait(condition: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"webhooks: {what} did not happen in {timeout} s")
        time.sleep(0.05)


def _notify(world: World, a: Server, b: Server, prefix: str, subjects: int, rate: float, watchers: int) -> dict:
    subject_ids = world.users(f"{prefix}-s", subjects)
    channels = max(1, subjects // SUBJECTS_PER_CHANNEL)
    watcher_specs = []
    for index in range(channels):
        members = subject_ids[index::channels]
        watcher_ids = world.users(f"{prefix}-w{index}", watchers)
        world.channel(f"{prefix}-{index}", watcher_ids + members)
        watcher_specs += [{"user": uid, "subjects": members} for uid in watcher_ids]
    return run_job(
        {
            "scenario": "notify",
            "watchers": [
                {"url": b.ws_url(f"token={world.token(w['user'])}"), "subjects": w["subjects"]} for w in watcher_specs
            ],
            "subjects": [{"user": s, "url": a.ws_url(f"token={world.token(s)}")} for s in subject_ids],
            "rate": rate,
            "hold": 0.5,
            "settle": 1.5,
            "heartbeat": 0.0,
        }
    )


def _delivered(receiver: Receiver, count: int) -> list[tuple[str, str, float, float]]:
    found: list = []

    def enough() -> bool:
        nonlocal found
        found = receiver.receipts()
        return len({receipt[1] for receipt in found}) >= count

    _wait(enough, f"{count} deliveries")
    return found


def phase_webhooks(world: World, workdir: Path, sizes: Sizes) -> dict:
    """Delivery latency and rate, and presence's latency beside a hanging receiver."""
    from webhooks.models import Delivery, Endpoint

    # Each subject is an online and an offline.
    subjects = max(5, sizes.webhook_transitions // 2)
    rate = sizes.notify_rate
    receiver = Receiver()
    Endpoint.objects.create(environment=world.environment, url=receiver.url, events=EVENTS)
    # A timeout above the receiver's holds: a held request is answered late, not retried.
    env = {**CHURN_TIMINGS, "RELAY_WEBHOOK_ALLOW_PRIVATE": "1", "RELAY_WEBHOOK_TIMEOUT_MS": "60000"}
    a, b = daphne("relay-webhooks-a", workdir, **env), daphne("relay-webhooks-b", workdir, **env)
    try:
        for server in (a, b):
            _wait(lambda server=server: _listening(server), "the instances reading the endpoint")
        warm = world.users("webhooks-warmup", 1)
        world.channel("webhooks-warmup", warm)
        for server in (a, b):
            open_and_close([server.ws_url(f"token={world.token(warm[0])}")])

        say(f"webhooks: {subjects} subjects ({2 * subjects} transitions) at {rate}/s, healthy receiver")
        before = len(receiver.receipts())
        healthy = _notify(world, a, b, "wh-healthy", subjects, rate, sizes.notify_watchers)
        receipts = _delivered(receiver, before + 2 * subjects)[before:]
        latencies = [(arrived - stamp) * 1000 for kind, _, stamp, arrived in receipts if kind in EVENTS]

        # A backlog: the receiver holds what it gets until every event is in the outbox.
        Delivery.objects.all().delete()
        before = len(receiver.receipts())
        receiver.send("gate")
        say(f"webhooks: {2 * subjects} transitions held back, then delivered at once")
        _notify(world, a, b, "wh-backlog", subjects, rate, 1)
        _wait(lambda: Delivery.objects.count() >= 2 * subjects, "the backlog in the outbox")
        released = time.time()
        receiver.send("open")
        burst = _delivered(receiver, before + 2 * subjects)[before:]
        # Every event of the backlog delivered, from the release to the last receipt (those held
        # at the gate were answered at the release).
        last = max(arrived for _, _, _, arrived in burst)
        events_per_s = 2 * subjects / max(last - released, 1e-3)

        # Last: its held requests and their retries are left behind when the instances stop.
        say(f"webhooks: the notify run again, with a receiver that holds every request {HANG_S} s")
        receiver.send(f"hang {HANG_S}")
        hanging = _notify(world, a, b, "wh-hanging", subjects, rate, sizes.notify_watchers)
        # The healthy run once more, after: the ratio is against both, so that what the machine did
        # meanwhile weighs on each side alike.
        receiver.send("ok")
        say("webhooks: the notify run again, receiver healthy")
        healthy_after = _notify(world, a, b, "wh-healthy-after", subjects, rate, sizes.notify_watchers)
    finally:
        a.stop()
        b.stop()
        receiver.stop()
        Endpoint.objects.all().delete()
    delivery_p99 = percentile(latencies, 99)
    healthy_p99 = (healthy["p99_ms"] + healthy_after["p99_ms"]) / 2
    ratio = hanging["p99_ms"] / healthy_p99 if healthy_p99 else 0.0
    say(
        f"webhooks: {events_per_s:.0f} events/s, delivery p99 {delivery_p99:.1f} ms, notify p99 "
        f"{healthy['p99_ms']} and {healthy_after['p99_ms']} ms healthy / {hanging['p99_ms']} ms hanging ({ratio:.2f})"
    )
    return {
        "webhooks.events_per_s": round(events_per_s, 1),
        "webhooks.delivery_p99_ms": round(delivery_p99, 2),
        "webhooks.presence_p99_ratio_hanging_receiver": round(ratio, 3),
        "_webhooks_transitions": 2 * subjects,
        "_webhooks_delivery_p50_ms": round(percentile(latencies, 50), 2),
        "_webhooks_notify_p99_ms_healthy": healthy["p99_ms"],
        "_webhooks_notify_p99_ms_healthy_after": healthy_after["p99_ms"],
        "_webhooks_notify_p99_ms_hanging": hanging["p99_ms"],
    }
