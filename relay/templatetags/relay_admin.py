"""Template tags for the admin index: the per-environment overview."""

from django import template

from relay.dashboard import overviews

register = template.Library()


@register.inclusion_tag("admin/relay/overview.html")
def relay_overview() -> dict:
    """Render each environment's online and agent counts, linking to its Presence page."""
    return {"overviews": overviews()}
