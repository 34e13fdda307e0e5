"""The staff overview: who is online and which agents are alive, per environment.

It composes what presence and agents each know, so it is an app of its own rather than
a part of either: counts on the admin index and a Presence page per environment.
"""

from dataclasses import dataclass, field

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from agents.models import Registration
from agents.queries import alive_since, registrations_of
from presence.reads import online_members
from presence.status import Status, read_devices, read_statuses
from relay.admin import visible_environments
from relay.models import Environment, User


@dataclass
class Overview:
    """One environment at a glance; `online` is None when the presence store does not answer."""

    environment: Environment
    online: list[str] | None
    agents_alive: int = 0
    agents_total: int = 0
    users: list[User] = field(default_factory=list)

    @property
    def online_count(self) -> int | None:
        return None if self.online is None else len(self.online)


def overviews(environments: QuerySet) -> list[Overview]:
    """Each of `environments` with its online count and agent counts: one SCAN and two queries."""
    online = online_members()
    cutoff = alive_since()
    agents = {
        row["environment_id"]: row
        for row in Registration.objects.values("environment_id").annotate(
            total=Count("pk"), alive=Count("pk", filter=Q(last_seen__gte=cutoff))
        )
    }
    return [
        Overview(
            environment=environment,
            online=None if online is None else online.get(str(environment.id), []),
            agents_alive=agents.get(environment.id, {}).get("alive", 0),
            agents_total=agents.get(environment.id, {}).get("total", 0),
        )
        for environment in environments.order_by("name")
    ]


def environment_presence(request: HttpRequest, environment_id: str) -> HttpResponse:
    """The "Presence" page of one environment: online users and agent registrations."""
    # Another tenant's page is as missing as an unknown one to staff not granted it.
    environment = visible_environments(request.user).filter(pk=environment_id).first()
    if environment is None:
        raise Http404("no such environment")
    online = online_members()
    online_ids = None if online is None else online.get(str(environment.id), [])
    users = list(User.objects.filter(environment=environment, external_id__in=online_ids or []).order_by("external_id"))
    statuses = read_statuses(str(environment.id), [user.external_id for user in users])
    # The truth, invisible users included: staff see what the backend sees.
    online_rows = [
        (
            user,
            statuses.get(user.external_id, Status()).effective(),
            read_devices(str(environment.id), user.external_id) or [],
        )
        for user in users
    ]
    cutoff = alive_since()
    registrations = [(row, row.last_seen >= cutoff) for row in registrations_of(environment)]
    context = {
        **admin.site.each_context(request),
        "title": f"Presence in {environment.name}",
        "environment": environment,
        "online_unavailable": online is None,
        "online_users": users,
        "online_rows": online_rows,
        "registrations": registrations,
        "agents_alive": sum(alive for _, alive in registrations),
    }
    return render(request, "admin/overview/environment_presence.html", context)
