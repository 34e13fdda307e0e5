"""Django admin for staff: chat messages, read-only."""

from django.contrib import admin
from django.http import HttpRequest

from chat.models import Message
from relay.admin import TenantScopedAdmin
from relay.models import Environment


@admin.register(Message)
class MessageAdmin(TenantScopedAdmin):
    """Read-only: a message's seq is part of every client's resume position, so staff never edit one."""

    list_display = ("channel", "seq", "author", "preview", "environment", "created_at")
    list_filter = (
        ("channel__environment", admin.RelatedOnlyFieldListFilter),
        ("channel", admin.RelatedOnlyFieldListFilter),
    )
    search_fields = ("author__external_id",)
    fields = ("id", "channel", "seq", "author", "idem_key", "text", "created_at")
    readonly_fields = fields
    ordering = ("-created_at",)
    list_select_related = ("channel__environment", "author")
    environment_path = "channel__environment"
    environment_field = None

    @admin.display(description="text")
    def preview(self, obj: Message) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"

    @admin.display(description="environment", ordering="channel__environment__name")
    def environment(self, obj: Message) -> Environment:
        return obj.channel.environment

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Message | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Message | None = None) -> bool:
        return False
