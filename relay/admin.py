"""Django admin for staff: tenants, keys, users, channels and memberships."""

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from relay import reconcile
from relay.models import ApiKey, Channel, Environment, Membership, User


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
    list_display = ("name", "id", "user_count", "channel_count", "secret_rotated_at", "created_at")
    search_fields = ("name", "id")
    readonly_fields = ("id", "secret_rotated_at", "created_at")
    exclude = ("signing_secret",)
    inlines = [ApiKeyInline]
    actions = ["rotate_signing_secret", "issue_api_key"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(_users=Count("users", distinct=True), _channels=Count("channels", distinct=True))
        )

    @admin.display(description="users", ordering="_users")
    def user_count(self, obj: Environment) -> int:
        return obj._users

    @admin.display(description="channels", ordering="_channels")
    def channel_count(self, obj: Environment) -> int:
        return obj._channels

    @admin.action(description="Rotate the token signing secret (invalidates every token, closes every connection)")
    def rotate_signing_secret(self, request: HttpRequest, queryset: QuerySet) -> None:
        for environment in queryset:
            reconcile.rotate_secret(environment)
        self.message_user(
            request,
            f"Rotated the signing secret of {queryset.count()} environment(s); "
            "their open connections close within one refresh interval.",
        )

    @admin.action(description="Issue a new API key (shown once)")
    def issue_api_key(self, request: HttpRequest, queryset: QuerySet) -> None:
        for environment in queryset:
            _, secret = ApiKey.issue(environment, label=f"issued in admin by {request.user}")
            self.message_user(
                request, f"New API key for {environment}: {secret} (copy it now: it is not stored)", messages.WARNING
            )


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "label", "environment", "created_at", "last_used_at", "revoked_at")
    list_filter = ("environment", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("prefix", "label", "environment__name")
    readonly_fields = ("prefix", "environment", "created_at", "last_used_at")
    fields = ("prefix", "label", "environment", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user", "channel")


@admin.register(User)
class UserAdmin(admin.ModelAdmin):
    list_display = ("external_id", "name", "environment", "created_at")
    list_filter = ("environment",)
    search_fields = ("external_id", "name")
    inlines = [MembershipInline]


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "type", "environment", "member_count", "last_seq", "id", "created_at")
    list_filter = ("type", "environment")
    search_fields = ("name", "id")
    readonly_fields = ("id", "last_seq")
    inlines = [MembershipInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(_members=Count("memberships"))

    @admin.display(description="members", ordering="_members")
    def member_count(self, obj: Channel) -> int:
        return obj._members


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "channel", "environment", "created_at")
    list_filter = ("channel__environment", "channel__type")
    search_fields = ("user__external_id", "channel__name")
    autocomplete_fields = ("user", "channel")

    @admin.display(description="environment", ordering="channel__environment__name")
    def environment(self, obj: Membership) -> Environment:
        return obj.channel.environment

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("user", "channel__environment")
