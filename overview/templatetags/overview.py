"""Template tags for the admin index: the per-environment overview."""

from django import template

from overview.views import overviews

register = template.Library()


@register.inclusion_tag("admin/overview/overview.html")
def environments_overview() -> dict:
    """Render each environment's online and agent counts, linking to its Presence page."""
    return {"overviews": overviews()}
