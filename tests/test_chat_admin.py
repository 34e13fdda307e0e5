"""Messages in Django admin: staff read them (text included), nobody edits them there."""

import pytest

from chat.actions import send_message
from chat.models import Message

pytestmark = pytest.mark.django_db


def test_staff_see_messages_with_their_text_and_can_filter_by_environment(staff, acme, globex):
    send_message(acme.users["linh"], str(acme.channels["fleet"].id), "k", "hello from acme")
    send_message(globex.users["zed"], str(globex.channels["board"].id), "k", "hello from globex")

    listing = staff.get("/admin/chat/message/", {"channel__environment__id__exact": str(acme.environment.id)})
    detail = staff.get(f"/admin/chat/message/{Message.objects.get(text='hello from acme').pk}/change/")

    assert listing.status_code == 200
    assert "hello from acme" in listing.text and "hello from globex" not in listing.text
    assert detail.status_code == 200 and "hello from acme" in detail.text


def test_messages_cannot_be_added_changed_or_deleted_in_admin(staff, acme):
    sent = send_message(acme.users["linh"], str(acme.channels["fleet"].id), "k", "immutable")
    pk = sent.ack["id"]

    assert staff.get("/admin/chat/message/add/").status_code == 403
    assert staff.post(f"/admin/chat/message/{pk}/change/", {"text": "edited"}).status_code == 403
    assert staff.post(f"/admin/chat/message/{pk}/delete/", {"post": "yes"}).status_code == 403
    assert Message.objects.get(pk=pk).text == "immutable"
    assert staff.get(f"/admin/chat/message/{pk}/change/").status_code == 200
