"""Memberships in Django admin: staff can pair a tenant's own user and channel, never two tenants'."""

import pytest

from relay.models import Membership

pytestmark = pytest.mark.django_db


def test_a_membership_across_environments_is_refused_and_one_within_is_made(staff, acme, globex):
    hermit = acme.users["hermit"]
    foreign = staff.post("/admin/relay/membership/add/", {"user": hermit.pk, "channel": globex.channels["board"].id})
    assert foreign.status_code == 200
    assert "The user and the channel belong to different environments." in foreign.text
    assert not Membership.objects.filter(user=hermit).exists()

    own = staff.post("/admin/relay/membership/add/", {"user": hermit.pk, "channel": acme.channels["fleet"].id})
    assert own.status_code == 302
    assert list(Membership.objects.filter(user=hermit).values_list("channel__name", flat=True)) == ["fleet"]
