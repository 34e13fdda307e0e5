"""The staff overview's admin page."""

from django.contrib import admin
from django.urls import path

from overview import views

urlpatterns = [
    # Before admin.site.urls (relay.urls includes this first), whose catch-all would otherwise
    # answer it; admin_view makes it staff-only, like every admin page.
    path(
        "admin/environments/<uuid:environment_id>/presence/",
        admin.site.admin_view(views.environment_presence),
        name="overview_environment_presence",
    ),
]
