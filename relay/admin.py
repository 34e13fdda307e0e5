"""Django admin for staff: tenants, keys, users, channels, memberships and messages."""

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from relay.models import ApiKey, Channel, Environment, Membership, Message, User


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
    list_display = ("name", "id", "user_count", "channel_count", "presence_page", "secret_rotated_at", "created_at")
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

    @admin.display(description="presence")
    def presence_page(self, obj: Environment) -> str:
        return format_html('<a href="{}">who is online</a>', reverse("relay_environment_presence", args=[obj.pk]))

    @admin.action(description="Rotate the token signing secret (invalidates every token)")
    def rotate_signing_secret(self, request: HttpRequest, queryset: QuerySet) -> None:
        for environment in queryset:
            environment.rotate_signing_secret()
        self.message_user(request, f"Rotated the signing secret of {queryset.count()} environment(s).")

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


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    """Read-only: a message's seq is part of every client's resume position, so staff never edit one."""

    list_display = ("channel", "seq", "author", "preview", "environment", "created_at")
    list_filter = ("channel__environment", ("channel", admin.RelatedOnlyFieldListFilter))
    search_fields = ("author__external_id",)
    fields = ("id", "channel", "seq", "author", "idem_key", "text", "created_at")
    readonly_fields = fields
    ordering = ("-created_at",)
    list_select_related = ("channel__environment", "author")

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
