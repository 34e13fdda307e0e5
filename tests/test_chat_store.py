"""Storing messages: the per-channel seq, idempotency and membership, below the socket."""

import pytest

from chat import actions, queries
from chat.actions import send_message
from chat.exceptions import NotAMember
from chat.models import Message

pytestmark = pytest.mark.django_db


def test_each_channel_counts_its_own_seqs_from_one(acme):
    linh, fleet, general = acme.users["linh"], str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    seqs = [send_message(linh, channel, f"k{n}", "hi").ack["seq"] for n, channel in enumerate([fleet, general, fleet])]
    assert seqs == [1, 1, 2]


def test_the_same_idem_key_returns_the_first_message_and_stores_nothing(acme):
    linh, fleet = acme.users["linh"], str(acme.channels["fleet"].id)
    first = send_message(linh, fleet, "once", "first text")
    again = send_message(linh, fleet, "once", "a different text")
    assert (first.created, again.created) == (True, False)
    assert again.ack == first.ack
    assert again.message == first.message
    assert list(Message.objects.values_list("text", flat=True)) == ["first text"]


def test_an_idem_key_is_scoped_to_its_channel_and_author(acme):
    linh, tuan = acme.users["linh"], acme.users["tuan"]
    fleet, general = str(acme.channels["fleet"].id), str(acme.channels["general"].id)
    sends = [send_message(linh, fleet, "k", "a"), send_message(linh, general, "k", "b")]
    sends.append(send_message(tuan, fleet, "k", "c"))
    assert [s.created for s in sends] == [True, True, True]
    assert [(s.message["channel"], s.ack["seq"]) for s in sends] == [(fleet, 1), (general, 1), (fleet, 2)]


def test_a_resend_is_looked_up_only_once_its_insert_is_refused_and_burns_no_seq(acme, monkeypatch):
    linh, fleet = acme.users["linh"], str(acme.channels["fleet"].id)
    lookups: list[tuple] = []
    real_lookup = actions._sent_before

    def counted(*args):
        lookups.append(args)
        return real_lookup(*args)

    monkeypatch.setattr(actions, "_sent_before", counted)
    # A new idem_key costs no lookup: its insert is the check.
    winner = send_message(linh, fleet, "raced", "from the first socket")
    assert (winner.created, lookups) == (True, [])
    # The same key again (a resend after a lost ack, or a second socket racing the first): the
    # insert is refused, and the lookup finds the first one.
    loser = send_message(linh, fleet, "raced", "from the second socket")
    assert len(lookups) == 1
    assert (loser.created, loser.ack) == (False, winner.ack)
    assert Message.objects.count() == 1
    acme.channels["fleet"].refresh_from_db()
    assert acme.channels["fleet"].last_seq == 1
    assert send_message(linh, fleet, "next", "after the race").ack["seq"] == 2


@pytest.mark.parametrize("sender", ["hermit", "globex linh"])
def test_a_non_member_is_refused_and_nothing_is_stored(acme, globex, sender):
    user = globex.users["linh"] if sender == "globex linh" else acme.users[sender]
    fleet = str(acme.channels["fleet"].id)
    with pytest.raises(NotAMember):
        send_message(user, fleet, "k", "let me in")
    assert Message.objects.count() == 0
    acme.channels["fleet"].refresh_from_db()
    assert acme.channels["fleet"].last_seq == 0
    assert send_message(acme.users["linh"], fleet, "k", "members only").ack["seq"] == 1


def test_history_reads_after_a_seq_up_to_a_limit_and_a_ceiling(acme):
    linh, fleet = acme.users["linh"], str(acme.channels["fleet"].id)
    for n in range(1, 8):
        send_message(linh, fleet, f"k{n}", f"text {n}")
    assert [m["seq"] for m in queries.messages_after(fleet, 2, limit=3)] == [3, 4, 5]
    assert [m["seq"] for m in queries.messages_after(fleet, 2, limit=10, until=4)] == [3, 4]
    assert queries.messages_after(fleet, 7) == []
    assert queries.last_seq(fleet) == 7
