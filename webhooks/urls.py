from django.urls import path

from webhooks import views

urlpatterns = [
    path("v1/webhooks", views.webhooks),
    path("v1/webhooks/<str:webhook_id>", views.webhook),
]
