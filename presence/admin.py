"""Admin: the User list shows who is online now (a dot and a filter), read from Redis; user statuses.

`relay.admin.UserAdmin` is replaced by a subclass here so that `relay` never imports
`presence`. The page's flags come from one MGET for the page's users; the filter asks one
MGET for the users it filters.

A status saved here is a `presence.set` from staff: validated by the same model, stored and
announced by the same code as `PUT /v1/users/<id>/status` (docs/contract.md, Rich presence).
"""

from asgiref.sync import async_to_sync
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from pydantic import ValidationError

from presence.models import UserStatus
from presence.reads import users_online
from presence.status import Forbidden, apply_change, write_status
from relay.admin import TenantScopedAdmin, UserAdmin
from relay.frames import PresenceSet
from relay.models import User

# The fields of a `presence.set`, as the form names them.
SET_FIELDS = ("status", "text", "emoji", "until", "invisible")
# What a deleted row reads as: the defaults, told to watchers like any change.
CLEARED = PresenceSet(status="available", text="", emoji="", until=None, invisible=False)

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


class UserStatusForm(forms.ModelForm):
    """Checks what staff changed as a `presence.set` (`presence_set`, None when nothing changed)."""

    presence_set: PresenceSet | None = None

    def clean(self) -> dict:
        cleaned = super().clean()
        given = SET_FIELDS if self.instance._state.adding else [f for f in SET_FIELDS if f in self.changed_data]
        if not given or self.errors:
            return cleaned
        body = {name: cleaned.get(name) for name in given}
        if body.get("until") is not None:
            body["until"] = body["until"].isoformat()
        try:
            self.presence_set = PresenceSet.model_validate(body)
        except ValidationError as error:
            for problem in error.errors():
                field = problem["loc"][0] if problem["loc"] and problem["loc"][0] in given else None
                self.add_error(field, problem["msg"])
            return cleaned
        user = self.instance.user if not self.instance._state.adding else cleaned.get("user")
        if self.presence_set.invisible and user is not None and not user.environment.allow_invisible:
            self.add_error("invisible", "this environment does not allow invisibility")
        return cleaned


@admin.register(UserStatus)
class UserStatusAdmin(TenantScopedAdmin):
    """Each user's chosen status, scoped to the staff's environments like every tenant's data."""

    environment_path = "user__environment"
    environment_field = None
    form = UserStatusForm
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

    def save_model(self, request: HttpRequest, obj: UserStatus, form: UserStatusForm, change: bool) -> None:
        # Not `obj.save()`: stored and announced as `PUT .../status` stores and announces it.
        if form.presence_set is not None and not _set(obj.user, form.presence_set):
            # The environment stopped allowing invisibility after the form was checked.
            self.message_user(request, "this environment does not allow invisibility: nothing changed", messages.ERROR)

    def delete_model(self, request: HttpRequest, obj: UserStatus) -> None:
        # The user reads as the defaults from now on: watchers are told so.
        _set(obj.user, CLEARED)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for row in queryset.select_related("user"):
            _set(row.user, CLEARED)
        super().delete_queryset(request, queryset)


def _set(user: User, payload: PresenceSet) -> bool:
    """Store a set in admin's transaction and announce it once committed; False when invisibility
    is not allowed (nothing changed).

    Not `set_status` from here: its write takes a connection of its own, which the transaction
    admin holds open would keep waiting (SQLite's one writer).
    """
    environment_id = str(user.environment_id)
    try:
        change = write_status(environment_id, user, payload)
    except Forbidden:
        return False
    transaction.on_commit(lambda: async_to_sync(apply_change)(environment_id, user.external_id, change))
    return True
