"""The documentation's `presence_changed` receiver: the room's users, broadcast to the room on every change."""

import json

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels_presence.models import Room
from channels_presence.signals import presence_changed
from django.dispatch import receiver


@receiver(presence_changed)
def broadcast_presence(sender: type, room: Room, **kwargs: object) -> None:
    payload = {
        "channel_name": room.channel_name,
        "members": [user.username for user in room.get_users()],
        "lurkers": int(room.get_anonymous_count()),
    }
    text = json.dumps({"type": "presence", "payload": payload})
    async_to_sync(get_channel_layer().group_send)(room.channel_name, {"type": "presence.members", "text": text})
