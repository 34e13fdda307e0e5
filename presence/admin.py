"""Admin: the User list shows who is online now (a dot and a filter), read from Redis; user statuses.

`relay.admin.UserAdmin` is replaced by a subclass here so that `relay` never imports
`presence`. The page's flags come from one MGET for the page's users; the filter asks one
MGET for the users it filters.
"""

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from presence.models import UserStatus
from presence.reads import users_online
from presence.status import forget_cached
from relay.admin import TenantScopedAdmin, UserAdmin
from relay.models import User

ONLINE_ATTR = "_online_now"


class OnlineNowFilter(admin.SimpleListFilter):
    """Filter users by whether they hold a live connection on any instance right now."""

    title = "online now"
    parameter_name = "online_now"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() not in ("yes", "no"):
            return queryset
        users = list(queryset.only("pk", "environment_id", "external_id"))
        flags = users_online(users)
        if flags is None:
            # The store does not answer, so neither answer is known: show nobody rather than guess.
            return queryset.none()
        wanted = self.value() == "yes"
        return queryset.filter(pk__in=[user.pk for user, online in zip(users, flags, strict=True) if online == wanted])


class PresenceChangeList(ChangeList):
    """Reads the page's online flags in one round trip once the page's users are known."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # Iterating fills the queryset's cache, which the template then reuses.
        users = list(self.result_list)
        flags = users_online(users)
        for index, user in enumerate(users):
            setattr(user, ONLINE_ATTR, None if flags is None else flags[index])


admin.site.unregister(User)


@admin.register(User)
class PresenceUserAdmin(UserAdmin):
    list_display = ("online_now", *UserAdmin.list_display)
    list_filter = (OnlineNowFilter, *UserAdmin.list_filter)

    def get_changelist(self, request: HttpRequest, **kwargs) -> type[ChangeList]:
        return PresenceChangeList

    @admin.display(description="online")
    def online_now(self, user: User) -> str:
        online = getattr(user, ONLINE_ATTR, None)
        if online is None:
            return format_html('<span class="presence-unknown" title="{}">?</span>', "presence store unavailable")
        state, colour, label = ("online", "#2e7d32", "online now") if online else ("offline", "#9e9e9e", "offline")
        return format_html('<span class="presence-{}" title="{}" style="color: {}">●</span>', state, label, colour)


@admin.register(UserStatus)
class UserStatusAdmin(TenantScopedAdmin):
    """Each user's chosen status, scoped to the staff's environments like every tenant's data."""

    environment_path = "user__environment"
    environment_field = None
    list_display = ("user", "environment", "status", "text", "emoji", "until", "invisible", "last_seen_at")
    list_filter = ("status", "invisible")
    search_fields = ("user__external_id", "text")
    readonly_fields = ("last_seen_at", "updated_at")
    list_select_related = ("user__environment",)

    def get_readonly_fields(self, request: HttpRequest, obj: UserStatus | None = None) -> tuple:
        # A status belongs to one user for good.
        fields = tuple(super().get_readonly_fields(request, obj))
        return (*fields, "user") if obj is not None else fields

    @admin.display(description="environment", ordering="user__environment__name")
    def environment(self, row: UserStatus) -> str:
        return row.user.environment.name

    def save_model(self, request: HttpRequest, obj: UserStatus, form: object, change: bool) -> None:
        super().save_model(request, obj, form, change)
        # The Redis copy is dropped; the next read (a snapshot, a query) takes the table's.
        forget_cached(str(obj.user.environment_id), obj.user.external_id)
