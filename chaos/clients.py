"""The simulated users: real WebSocket clients that connect, close, resume, send, and stall.

Each client (a "slot": a user's device; some users have two) is one task with its own random
stream, derived from the seed and its name, so its choices replay whatever the interleaving.
Membership changes go through the HTTP API from one more task. Every frame each way, and every
open and close, goes to the history as it happens.
"""

import asyncio
import contextlib
import json
import random
from collections import defaultdict

import websockets

from chaos.deploy import Deployment, Tenant
from chaos.history import HistoryWriter

# How many clients out of ten are a user's second device.
SECOND_DEVICE_IN_TEN = 2


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class Slot:
    """One device of one user."""

    def __init__(self, population: "Population", tenant: Tenant, user: str, device: int) -> None:
        self.population = population
        self.tenant = tenant
        self.user = user
        self.name = f"{tenant.label}/{user}"
        self.rng = random.Random(f"{population.seed}:{self.name}:{device}")
        self.device = device
        self.sessions = 0
        self.ws: websockets.ClientConnection | None = None
        # The instance the open socket is on (the soak counts each instance's clients).
        self.instance = ""
        self.conn_id = ""
        self.closing = False
        self.reading = asyncio.Event()
        self.reading.set()
        self.reader: asyncio.Task | None = None

    @property
    def positions(self) -> dict[str, int]:
        """The highest contiguous seq this user saw per channel (shared by the user's devices, as an app stores it)."""
        return self.population.positions[self.name]

    def saw(self, channel: str, seq: int) -> None:
        """Advance the channel's position over `seq`: live messages may overtake each other, and a
        resume from the highest seq seen would skip one still on its way (docs/clients.md)."""
        # A channel first seen now starts where this user joined its stream.
        position = self.positions.setdefault(channel, seq - 1)
        if seq <= position:
            return
        ahead = self.population.ahead[self.name][channel]
        ahead.add(seq)
        while position + 1 in ahead:
            position += 1
            ahead.discard(position)
        self.positions[channel] = position

    async def run(self) -> None:
        quiet = self.population.quiet
        while not quiet.is_set():
            await pause(quiet, self.rng.uniform(0.3, 4.0))
            if quiet.is_set():
                return
            await self.session()

    async def session(self) -> None:
        """One connection: open, act at random until it closes or the run turns quiet (left open then)."""
        history, rng = self.population.history, self.rng
        self.sessions += 1
        conn_id = f"{self.name}#{self.device}.{self.sessions}"
        instance = rng.choice(self.population.deployment.serving())
        cursor = dict(self.positions) if rng.random() < 0.8 else None
        history.write(
            "open", conn=conn_id, tenant=self.tenant.label, user=self.user, instance=instance.name, cursor=cursor
        )
        try:
            ws = await websockets.connect(
                instance.ws_url(self.tenant.tokens[self.user], cursor),
                open_timeout=10,
                max_size=2**22,
                ping_interval=None,
                proxy=None,
            )
        except (OSError, TimeoutError, websockets.InvalidHandshake) as error:
            history.write("close", conn=conn_id, code=None, by="error", error=type(error).__name__)
            return
        self.ws, self.conn_id, self.closing, self.instance = ws, conn_id, False, instance.name
        self.reading.set()
        self.reader = asyncio.create_task(self.read(ws, conn_id))
        sent = 0
        while not self.population.quiet.is_set():
            done, _ = await asyncio.wait([self.reader], timeout=rng.uniform(0.5, 4.0))
            if done or self.population.quiet.is_set():
                break
            roll = rng.random()
            if roll < 0.12:
                await self.close()
                break
            if roll < 0.6:
                sent += 1
                await self.send_message(ws, conn_id, sent)
        if self.reader.done():
            self.ws = None

    async def send_message(self, ws: websockets.ClientConnection, conn_id: str, sent: int) -> None:
        channels = self.population.channels_of[conn_id]
        if not channels:
            return
        # Now and then the same idem_key again, as a client resending after a lost ack.
        if sent > 1 and self.rng.random() < 0.1:
            frame = self.population.last_sent[conn_id]
        else:
            channel = self.rng.choice(sorted(channels))
            frame = {
                "type": "message.send",
                "payload": {"idem_key": f"{conn_id}:{sent}", "channel": channel, "text": f"m{sent}"},
            }
            self.population.last_sent[conn_id] = frame
        self.population.history.write("send", conn=conn_id, frame=frame)
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(json.dumps(frame))

    async def read(self, ws: websockets.ClientConnection, conn_id: str) -> None:
        history = self.population.history
        try:
            while True:
                await self.reading.wait()
                frame = json.loads(await ws.recv())
                history.write("recv", conn=conn_id, frame=frame)
                payload = frame.get("payload") or {}
                if frame.get("type") == "connection.ack":
                    self.population.channels_of[conn_id] = set(payload.get("channels", []))
                elif frame.get("type") == "message.created":
                    self.saw(payload["channel"], payload["seq"])
        except websockets.ConnectionClosed:
            pass
        finally:
            if not self.closing:
                history.write("close", conn=conn_id, code=ws.close_code, by="server")

    async def close(self) -> None:
        """Close from the client's side (recorded when the client decides, before the handshake)."""
        if self.ws is None or self.reader is None or self.reader.done():
            return
        self.closing = True
        self.reading.set()
        self.population.history.write("close", conn=self.conn_id, code=1000, by="client")
        await self.ws.close()
        await self.reader
        self.ws = None

    def stall(self) -> str | None:
        """Stop reading (the socket's buffers fill, then the server's); return the connection stalled."""
        if self.ws is None or self.reader is None or self.reader.done():
            return None
        self.reading.clear()
        return self.conn_id


class Population:
    """Every simulated user of both tenants, and the membership changes made through the API."""

    def __init__(self, seed: int, deployment: Deployment, tenants: list[Tenant], history: HistoryWriter) -> None:
        self.seed = seed
        self.deployment = deployment
        self.tenants = tenants
        self.history = history
        self.quiet = asyncio.Event()
        self.positions: dict[str, dict[str, int]] = defaultdict(dict)
        # Seqs seen above each user's position, per channel, until the ones between arrive.
        self.ahead: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        self.channels_of: dict[str, set[str]] = defaultdict(set)
        self.last_sent: dict[str, dict] = {}
        rng = random.Random(f"{seed}:devices")
        self.slots = [
            Slot(self, tenant, user, device)
            for tenant in tenants
            for user in tenant.users
            for device in range(1 + (rng.randrange(10) < SECOND_DEVICE_IN_TEN))
        ]
        self.membership = {
            (tenant.label, channel, user): True for tenant in tenants for channel, user in tenant.members
        }

    async def change_memberships(self) -> None:
        """Add and remove members at random (never from their home channel) through the API."""
        rng = random.Random(f"{self.seed}:memberships")
        while not self.quiet.is_set():
            await pause(self.quiet, rng.uniform(0.3, 1.5))
            if self.quiet.is_set():
                return
            tenant = rng.choice(self.tenants)
            user = rng.choice(tenant.users)
            channel = rng.choice(sorted(set(tenant.channels) - {tenant.home[user]}))
            key = (tenant.label, channel, user)
            member = self.membership.get(key, False)
            op = rng.choice(("add", "remove")) if member is None else ("remove" if member else "add")
            method = "DELETE" if op == "remove" else "PUT"
            started = self.history.now()
            try:
                status, _ = await asyncio.to_thread(
                    self.deployment.api, method, f"/v1/channels/{channel}/members/{user}", None, tenant.api_key
                )
            except (OSError, ValueError):  # no answer, or one that is not JSON: the outcome is unknown
                status = None
            self.history.write(
                "member", t=started, t_end=self.history.now(), tenant=tenant.label, channel=channel, user=user,
                op=op, status=status,
            )  # fmt: skip
            applied = {"add": (200, 201), "remove": (204,)}[op]
            self.membership[key] = (op == "add") if status in applied else None

    async def stall_one(self, rng: random.Random, seconds: float) -> str | None:
        """Stall a random connected client's reads for `seconds`; return its connection id."""
        connected = [slot for slot in self.slots if slot.ws is not None and not slot.closing]
        if not connected:
            return None
        slot = rng.choice(connected)
        conn_id = slot.stall()
        await asyncio.sleep(seconds)
        slot.reading.set()
        return conn_id

    async def close_all(self) -> None:
        for slot in self.slots:
            await slot.close()
