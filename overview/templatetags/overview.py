"""Template tags for the admin index: the per-environment overview."""

from django import template

from overview.views import overviews
from relay.admin import visible_environments

register = template.Library()


@register.inclusion_tag("admin/overview/overview.html", takes_context=True)
def environments_overview(context: template.Context) -> dict:
    """Render the online and agent counts of each environment the staff member may see, linking to its Presence page."""
    return {"overviews": overviews(visible_environments(context["request"].user))}
