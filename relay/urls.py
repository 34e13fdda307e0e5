"""Admin, the /v1 API, health, metrics and the demo web client."""

from django.contrib import admin
from django.urls import include, path

from relay import api, dashboard

urlpatterns = [
    # Before admin.site.urls, whose catch-all would otherwise answer it; admin_view
    # makes it staff-only, like every admin page.
    path(
        "admin/environments/<uuid:environment_id>/presence/",
        admin.site.admin_view(dashboard.environment_presence),
        name="relay_environment_presence",
    ),
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
