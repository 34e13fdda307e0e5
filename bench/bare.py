"""The bare baseline: a Channels consumer that accepts, joins the same groups and acks.

No token, no database, no presence: `?channels=<uuid>,<uuid>` names the groups. The
CPU it spends per connect is what Channels, Daphne and channels-redis cost by
themselves; Relay's connect is measured against it (`ratio.connect_cpu_vs_bare`).
"""

import json
import os
from urllib.parse import parse_qs

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "relay.settings")
django_asgi_app = get_asgi_application()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402


class BareConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        query = parse_qs(self.scope["query_string"].decode())
        self.groups_joined = [
            f"{family}.{channel}"
            for channel in query.get("channels", [""])[0].split(",")
            if channel
            for family in ("presence", "messages")
        ]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send(text_data=json.dumps({"type": "connection.ack", "payload": {}}))

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)


application = ProtocolTypeRouter(
    {"http": django_asgi_app, "websocket": URLRouter([path("v1/ws", BareConsumer.as_asgi())])}
)
