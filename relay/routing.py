"""WebSocket routes."""

from django.urls import path

from relay.consumers import GatewayConsumer

websocket_urlpatterns = [
    path("v1/ws", GatewayConsumer.as_asgi()),
]
