"""The demo web client at / and its dev-only sign-in."""

from django.urls import path

from web import views

urlpatterns = [
    path("", views.index, name="index"),
    path("demo/session", views.demo_session, name="demo-session"),
]
