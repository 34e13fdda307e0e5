"""Admin, the /v1 API, health, metrics, and each app's routes."""

from django.contrib import admin
from django.urls import include, path

from relay import api, health, schema

urlpatterns = [
    # Admin pages of the apps come before admin.site.urls, whose catch-all would answer them.
    path("", include("overview.urls")),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("metrics", health.metrics),
    path("v1/users", api.users),
    path("v1/channels", api.channels),
    path("v1/channels/<str:channel_id>/members/<path:user_id>", api.member),
    path("v1/tokens", api.tokens),
    path("v1/settings", api.environment_settings),
    path("v1/openapi.json", schema.openapi),
    path("v1/schema/frames.json", schema.frames),
    path("", include("chat.urls")),
    path("", include("presence.urls")),
    path("", include("agents.urls")),
    path("", include("webhooks.urls")),
    path("", include("web.urls")),
]
