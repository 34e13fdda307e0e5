"""Django admin for staff: tenants, keys, users, channels and memberships.

Superusers see every environment; other staff only those they are granted (`Environment.staff`),
on every page: each model admin of a tenant's data derives from `TenantScopedAdmin`, which
scopes its rows, its foreign-key choices and its filters, and freezes an object's environment
once it exists.
"""

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Model, QuerySet
from django.http import HttpRequest, HttpResponse

from relay import reconcile
from relay.models import ApiKey, Channel, Environment, Membership, User


def visible_environments(user: Any) -> QuerySet:
    """The environments `user` may see in admin: all for a superuser, else those granted to them."""
    if user.is_superuser:
        return Environment.objects.all()
    return Environment.objects.filter(staff=user)


class TenantScopedAdmin(admin.ModelAdmin):
    """A model admin of one tenant's data, shown only to staff granted its environment.

    `environment_path` is the lookup from the model to its Environment ("environment",
    "channel__environment", ...); `environment_field` the model's own foreign key to it, if any,
    read-only once the object exists (so a membership can never span two tenants).
    """

    environment_path = "environment"
    environment_field: str | None = "environment"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(**{f"{self.environment_path}__staff": request.user})

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> tuple:
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and self.environment_field and self.environment_field not in fields:
            fields += (self.environment_field,)
        return fields

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs["queryset"] = scoped_choices(db_field.related_model, request)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


def scoped_choices(model: type[Model], request: HttpRequest) -> QuerySet:
    """The rows of `model` a form may offer `request.user`: those of environments they see."""
    environments = visible_environments(request.user)
    if model is Environment:
        return environments
    if hasattr(model, "environment"):
        return model._default_manager.filter(environment__in=environments)
    return model._default_manager.all()


class ScopedInline(admin.TabularInline):
    """An inline whose foreign-key choices are scoped like `TenantScopedAdmin`'s."""

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs["queryset"] = scoped_choices(db_field.related_model, request)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("prefix", "label", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Environment | None = None) -> bool:
        # A key's secret is shown once, by `createenvironment` or the admin action.
        return False


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "id",
        "user_count",
        "channel_count",
        "allow_invisible",
        "share_last_seen",
        "secret_rotated_at",
        "created_at",
    )
    search_fields = ("name", "id")
    readonly_fields = ("id", "secret_rotated_at", "created_at")
    exclude = ("signing_secret",)
    filter_horizontal = ("staff",)
    inlines = [ApiKeyInline]
    actions = ["rotate_signing_secret", "issue_api_key"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            visible_environments(request.user)
            .annotate(_users=Count("users", distinct=True), _channels=Count("channels", distinct=True))
            .order_by(*self.get_ordering(request) or ("name",))
        )

    def get_exclude(self, request: HttpRequest, obj: Environment | None = None) -> tuple:
        # Who is granted what is the superusers' to decide.
        if request.user.is_superuser:
            return self.exclude
        return (*self.exclude, "staff")

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A new tenant would be invisible to the staff member who made it: superusers only.
        return request.user.is_superuser and super().has_add_permission(request)

    @admin.display(description="users", ordering="_users")
    def user_count(self, obj: Environment) -> int:
        return obj._users

    @admin.display(description="channels", ordering="_channels")
    def channel_count(self, obj: Environment) -> int:
        return obj._channels

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        # Django drops an action the user may not run from the list and answers its POST with a
        # "no action selected" redirect; refused outright instead, so a script sees it was refused.
        action = request.POST.get("action") if request.method == "POST" else None
        if action in self.actions and action not in self.get_actions(request):
            raise PermissionDenied(f"not permitted: {action}")
        return super().changelist_view(request, extra_context)

    def has_issue_api_key_permission(self, request: HttpRequest) -> bool:
        """Issuing a key is adding one: the `relay.add_apikey` permission."""
        return request.user.has_perm("relay.add_apikey")

    @admin.action(
        description="Rotate the token signing secret (invalidates every token, closes every connection)",
        permissions=["change"],
    )
    def rotate_signing_secret(self, request: HttpRequest, queryset: QuerySet) -> None:
        for environment in queryset:
            reconcile.rotate_secret(environment)
        self.message_user(
            request,
            f"Rotated the signing secret of {queryset.count()} environment(s); "
            "their open connections close within one refresh interval.",
        )

    @admin.action(description="Issue a new API key (shown once)", permissions=["issue_api_key"])
    def issue_api_key(self, request: HttpRequest, queryset: QuerySet) -> None:
        for environment in queryset:
            _, secret = ApiKey.issue(environment, label=f"issued in admin by {request.user}")
            self.message_user(
                request, f"New API key for {environment}: {secret} (copy it now: it is not stored)", messages.WARNING
            )


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = ("prefix", "label", "environment", "created_at", "last_used_at", "revoked_at")
    list_filter = (("environment", admin.RelatedOnlyFieldListFilter), ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("prefix", "label", "environment__name")
    readonly_fields = ("prefix", "environment", "created_at", "last_used_at")
    fields = ("prefix", "label", "environment", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class MembershipInline(ScopedInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user", "channel")


@admin.register(User)
class UserAdmin(TenantScopedAdmin):
    list_display = ("external_id", "name", "environment", "created_at")
    list_filter = (("environment", admin.RelatedOnlyFieldListFilter),)
    search_fields = ("external_id", "name")
    inlines = [MembershipInline]


@admin.register(Channel)
class ChannelAdmin(TenantScopedAdmin):
    list_display = ("name", "type", "environment", "member_count", "last_seq", "id", "created_at")
    list_filter = ("type", ("environment", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "id")
    readonly_fields = ("id", "last_seq")
    inlines = [MembershipInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(_members=Count("memberships"))

    @admin.display(description="members", ordering="_members")
    def member_count(self, obj: Channel) -> int:
        return obj._members


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    environment_path = "channel__environment"
    environment_field = None
    list_display = ("user", "channel", "environment", "created_at")
    list_filter = (("channel__environment", admin.RelatedOnlyFieldListFilter), "channel__type")
    search_fields = ("user__external_id", "channel__name")
    autocomplete_fields = ("user", "channel")

    @admin.display(description="environment", ordering="channel__environment__name")
    def environment(self, obj: Membership) -> Environment:
        return obj.channel.environment

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("user", "channel__environment")
