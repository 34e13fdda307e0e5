"""Chat's HTTP routes."""

from django.urls import path

from chat import views

urlpatterns = [
    path("v1/channels/<str:channel_id>/messages", views.channel_messages),
]
