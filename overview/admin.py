"""Admin: each environment's row links to its Presence page.

`relay.admin.EnvironmentAdmin` is replaced by a subclass here, so that `relay` never
needs to know the overview exists.
"""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from relay.admin import EnvironmentAdmin
from relay.models import Environment

admin.site.unregister(Environment)


@admin.register(Environment)
class OverviewEnvironmentAdmin(EnvironmentAdmin):
    list_display = (*EnvironmentAdmin.list_display[:4], "presence_page", *EnvironmentAdmin.list_display[4:])

    @admin.display(description="presence")
    def presence_page(self, obj: Environment) -> str:
        return format_html('<a href="{}">who is online</a>', reverse("overview_environment_presence", args=[obj.pk]))
