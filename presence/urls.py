"""Presence's HTTP routes."""

from django.urls import path

from presence import views

urlpatterns = [
    path("v1/channels/<str:channel_id>/presence", views.channel_presence),
    path("v1/users/<path:user_id>/presence", views.user_presence),
    path("v1/users/<path:user_id>/status", views.user_status),
]
