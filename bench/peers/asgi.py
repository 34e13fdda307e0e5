"""The peer: a presence gateway built on django-channels-presence-4-0 the way its documentation shows.

`/v1/ws?user=<username>&channels=<uuid>,<uuid>`: a synchronous WebsocketConsumer that, on
connect, accepts, calls `Room.objects.add` for each of its rooms and acknowledges; on
disconnect, `Room.objects.remove`; every frame it receives touches its presence rows
(`touch_presence`: clients send `"heartbeat"`). The `presence_changed` receiver broadcasts
the room's users to the room, as the documentation's example does (bench/peers/receivers.py,
connected by the app's ready() in every process, the prune job's too). Stale rows (an instance
that died) are removed by the prune job (bench/peers/prune.py, the package's periodic task).

The user is looked up by name in the database, as AuthMiddlewareStack's session lookup would;
a room is `peer.<channel uuid>`, so the peer serves the same rooms as Relay.
"""

import json
import os
from urllib.parse import parse_qs

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.peers.settings")
django_asgi_app = get_asgi_application()

from channels.generic.websocket import WebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels_presence.decorators import touch_presence  # noqa: E402
from channels_presence.models import Room  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.urls import path  # noqa: E402


def room_name(channel_id: str) -> str:
    return f"peer.{channel_id}"


class PeerConsumer(WebsocketConsumer):
    def connect(self) -> None:
        query = parse_qs(self.scope["query_string"].decode())
        self.user = get_user_model().objects.get(username=query["user"][0])
        self.rooms = [room_name(channel) for channel in query.get("channels", [""])[0].split(",") if channel]
        self.accept()
        for room in self.rooms:
            Room.objects.add(room, self.channel_name, self.user)
        self.send(text_data=json.dumps({"type": "connection.ack", "payload": {}}))

    def disconnect(self, code: int) -> None:
        for room in self.rooms:
            Room.objects.remove(room, self.channel_name)

    @touch_presence
    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        pass

    def presence_members(self, event: dict) -> None:
        self.send(text_data=event["text"])


application = ProtocolTypeRouter(
    {"http": django_asgi_app, "websocket": URLRouter([path("v1/ws", PeerConsumer.as_asgi())])}
)
