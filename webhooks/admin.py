"""Django admin for staff: each tenant's webhook endpoints and their delivery log.

Scoped like every tenant's data (relay.admin.TenantScopedAdmin). Secrets are never shown (the
API shows one once, at creation) and endpoints are created through the API, which checks the
URL; the log is read-only: what was attempted, how it went and when the next try is due.
"""

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest

from relay.admin import TenantScopedAdmin
from webhooks.models import Delivery, Endpoint


@admin.register(Endpoint)
class EndpointAdmin(TenantScopedAdmin):
    list_display = ("url", "environment", "events", "enabled", "pending", "disabled_at", "created_at")
    list_filter = (("environment", admin.RelatedOnlyFieldListFilter), "enabled")
    search_fields = ("url",)
    exclude = ("secret",)
    readonly_fields = ("id", "url", "environment", "events", "disabled_at", "created_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        pending = Count("deliveries", filter=Q(deliveries__status=Delivery.PENDING))
        return super().get_queryset(request).select_related("environment").annotate(_pending=pending)

    @admin.display(description="pending", ordering="_pending")
    def pending(self, obj: Endpoint) -> int:
        return obj._pending

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(TenantScopedAdmin):
    environment_path = "endpoint__environment"
    environment_field = None
    list_display = (
        "event_type",
        "endpoint",
        "environment",
        "status",
        "attempts",
        "last_status_code",
        "last_latency_ms",
        "last_error",
        "next_attempt_at",
        "created_at",
        "delivered_at",
    )
    list_filter = (("endpoint__environment", admin.RelatedOnlyFieldListFilter), "status", "event_type")
    search_fields = ("webhook_id", "endpoint__url")
    # The body is the tenant's data (message text): the log says what happened, not what was said.
    exclude = ("body", "lease")
    list_select_related = ("endpoint__environment",)

    @admin.display(description="environment", ordering="endpoint__environment__name")
    def environment(self, obj: Delivery) -> object:
        return obj.endpoint.environment

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return False
