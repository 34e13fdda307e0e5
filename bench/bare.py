"""The bare baselines: Channels consumers that do the least Relay's connect and churn could do.

No token, no database, no election: `?channels=<uuid>,<uuid>` names the groups.

- `/v1/ws`: accept, join the same groups Relay joins, ack. The CPU it spends per connect is what
  Channels, Daphne and channels-redis cost by themselves; Relay's connect is measured against it
  (`ratio.connect_cpu_vs_bare`).
- `/v1/ws` with `&user=<id>`: also announce presence like the naive version of Relay: an
  `online` to each channel's group on connect and an `offline` on disconnect, delivered to each
  member as a `presence.changed` frame. No limit, no grace, no single publisher, no dedup. The
  churn rate it sustains on the same machine is the stack's own ceiling for
  `transitions.max_per_s` (`_bare_transitions_max_per_s`).
"""

import os
from urllib.parse import parse_qs

import orjson
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
django_asgi_app = get_asgi_application()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402


class BareConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        query = parse_qs(self.scope["query_string"].decode())
        self.channel_ids = [channel for channel in query.get("channels", [""])[0].split(",") if channel]
        self.user = query.get("user", [None])[0]
        self.groups_joined = [f"{family}.{channel}" for channel in self.channel_ids for family in ("presence", "chat")]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send(text_data=orjson.dumps({"type": "connection.ack", "payload": {}}).decode())
        await self.announce("online")

    async def disconnect(self, code: int) -> None:
        await self.announce("offline")
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def announce(self, state: str) -> None:
        if self.user is None:
            return
        for channel in self.channel_ids:
            await self.channel_layer.group_send(
                f"presence.{channel}", {"type": "bare.changed", "user": self.user, "state": state}
            )

    async def bare_changed(self, event: dict) -> None:
        payload = {"user": event["user"], "state": event["state"]}
        await self.send(text_data=orjson.dumps({"type": "presence.changed", "payload": payload}).decode())


application = ProtocolTypeRouter(
    {"http": django_asgi_app, "websocket": URLRouter([path("v1/ws", BareConsumer.as_asgi())])}
)
