"""Admin, the /v1 API, health, metrics and the demo web client."""

from django.contrib import admin
from django.urls import include, path

from relay import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", api.healthz),
    path("readyz", api.readyz),
    path("metrics", api.metrics),
    path("v1/users", api.users),
    path("v1/channels", api.channels),
    path("v1/channels/<str:channel_id>/members/<path:user_id>", api.member),
    path("v1/channels/<str:channel_id>/messages", api.channel_messages),
    path("v1/tokens", api.tokens),
    path("", include("presence.urls")),
    path("", include("agents.urls")),
    path("", include("web.urls")),
]
