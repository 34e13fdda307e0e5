"""Django admin for staff: the agent registry, read-mostly (rows come from workers, not from people)."""

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from agents.models import Registration
from agents.queries import alive_since
from relay.admin import TenantScopedAdmin


class AliveFilter(admin.SimpleListFilter):
    """Alive = seen within RELAY_AGENT_TTL_MS; a stale row is one the next sweep removes."""

    title = "alive"
    parameter_name = "alive"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "Alive"), ("no", "Stale")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(last_seen__gte=alive_since())
        if self.value() == "no":
            return queryset.filter(last_seen__lt=alive_since())
        return queryset


@admin.register(Registration)
class RegistrationAdmin(TenantScopedAdmin):
    list_display = (
        "instance",
        "identity",
        "environment",
        "cognition",
        "weight",
        "family",
        "host",
        "registered_at",
        "last_seen",
        "alive",
    )
    list_filter = (("environment", admin.RelatedOnlyFieldListFilter), "family", "cognition", "host", AliveFilter)
    search_fields = ("instance", "identity__external_id")
    ordering = ("-last_seen",)
    list_select_related = ("identity", "environment")
    actions = ["remove_selected"]

    def get_actions(self, request: HttpRequest) -> dict:
        # "Remove selected" replaces Django's delete_selected: one removal action, no confirmation
        # page, since a worker that is still alive simply registers again.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Registration | None = None) -> bool:
        # Rows are the workers' own statements about themselves; staff look and remove, never edit.
        return False

    @admin.display(boolean=True, description="alive", ordering="last_seen")
    def alive(self, obj: Registration) -> bool:
        return obj.last_seen >= alive_since()

    @admin.action(description="Remove selected registrations", permissions=["delete"])
    def remove_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        removed, _ = queryset.delete()
        self.message_user(request, f"Removed {removed} registration(s).")
