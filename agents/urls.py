"""The agents app's API routes, included at the root by relay.urls."""

from django.urls import path

from agents import views

urlpatterns = [
    path("v1/agents", views.agents),
]
