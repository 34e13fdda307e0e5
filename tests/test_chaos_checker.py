"""The chaos checker (chaos/checker.py) on synthetic histories: a clean one passes, each planted fault is caught.

Who is who: in tenant "a", u1 and u2 share channel "ca"; u2 leaves once and comes back with a
cursor; messages flow both ways. Tenant "b" has its own u1 in its own channel "cb", and "a1"
exists only in tenant a. Timings are the run's shape at small numbers: grace 1.5 s, TTL 3 s,
refresh 1 s, margin 0.3 s, slack 1 s (so presence must have converged 7.5 s after a fault).
"""

import pytest

from chaos import checker

ONLINE, OFFLINE = "online", "offline"


def meta() -> dict:
    return {
        "k": "meta",
        "t": 0.0,
        "seed": 7,
        "replay": "python -m chaos --seed 7 --minutes 1 --users 4",
        "timings": {"grace_ms": 1500, "ttl_ms": 3000, "refresh_ms": 1000, "margin_ms": 300},
        "slack_s": 1.0,
        "tenants": {
            "a": {"users": ["u1", "u2", "a1"], "channels": {"ca": "c00"}},
            "b": {"users": ["u1"], "channels": {"cb": "c00"}},
        },
        "members": [["a", "ca", "u1"], ["a", "ca", "u2"], ["a", "ca", "a1"], ["b", "cb", "u1"]],
    }


def opened(t: float, conn: str, tenant: str, user: str, cursor: dict | None = None) -> dict:
    return {"k": "open", "t": t, "conn": conn, "tenant": tenant, "user": user, "instance": "gw1", "cursor": cursor}


def recv(t: float, conn: str, kind: str, **payload: object) -> dict:
    return {"k": "recv", "t": t, "conn": conn, "frame": {"type": kind, "payload": payload}}


def connected(t: float, conn: str, tenant: str, user: str, online: list[str], cursor: dict | None = None) -> list:
    channel = "ca" if tenant == "a" else "cb"
    return [
        opened(t, conn, tenant, user, cursor),
        recv(t + 0.1, conn, "connection.ack", connection_id=conn, user=user, channels=[channel]),
        recv(t + 0.1, conn, "presence.snapshot", online=online),
    ]


def changed(t: float, conn: str, user: str, state: str) -> dict:
    return recv(t, conn, "presence.changed", user=user, state=state)


def closed(t: float, conn: str, by: str = "client") -> dict:
    return {"k": "close", "t": t, "conn": conn, "code": 1000, "by": by}


def message(t: float, sender: str, seq: int, receivers: list[str], channel: str = "ca") -> list:
    idem = f"{sender}:{seq}"
    frame = {"type": "message.send", "payload": {"idem_key": idem, "channel": channel, "text": "hi"}}
    records = [{"k": "send", "t": t, "conn": sender, "frame": frame}]
    records.append(recv(t + 0.05, sender, "message.ack", idem_key=idem, id=f"m{seq}", channel=channel, seq=seq))
    author = sender.split("/")[1].split("#")[0]
    for receiver in receivers:
        records.append(
            recv(t + 0.05, receiver, "message.created", id=f"m{seq}", channel=channel, seq=seq, user=author, text="hi")
        )
    return records


def clean() -> list[dict]:
    """u1 stays; u2 comes, sends, leaves for longer than the grace, resumes, and everyone hears it all once."""
    u1, u2, u2b, bu1 = "a/u1#0.1", "a/u2#0.1", "a/u2#0.2", "b/u1#0.1"
    return [
        meta(),
        *connected(1.0, u1, "a", "u1", ["u1"]),
        *connected(2.0, u2, "a", "u2", ["u1", "u2"]),
        changed(2.15, u1, "u2", ONLINE),
        *message(3.0, u2, 1, [u1, u2]),
        closed(5.0, u2),
        changed(6.9, u1, "u2", OFFLINE),
        *connected(10.0, u2b, "a", "u2", ["u1", "u2"], cursor={"ca": 1}),
        changed(10.15, u1, "u2", ONLINE),
        *message(11.0, u1, 2, [u1, u2b]),
        *message(12.0, u2b, 3, [u1, u2b]),
        *connected(12.0, bu1, "b", "u1", ["u1"]),
        {"k": "logscan", "instance": "gw1", "lines": 120},
        {"k": "checkpoint", "t": 25.0},
        closed(26.0, u1),
        closed(26.0, u2b),
        closed(26.0, bu1),
        {"k": "end", "t": 26.5},
    ]


def in_order(records: list[dict]) -> list[dict]:
    """The records by time, the meta record first (as a run writes them)."""
    return sorted(records, key=lambda record: (record["k"] != "meta", record.get("t", 0)))


def moved(records: list[dict], conn: str, kind: str, seq: int, t: float) -> list[dict]:
    """`records` with `conn`'s `kind` frame of `seq` received at `t` instead, in time order."""
    return in_order(
        [
            {**record, "t": t}
            if record["k"] == "recv"
            and record["conn"] == conn
            and record["frame"]["type"] == kind
            and record["frame"]["payload"]["seq"] == seq
            else record
            for record in records
        ]
    )


def without(records: list[dict], unwanted: list[dict]) -> list[dict]:
    return [record for record in records if record not in unwanted]


def found(records: list[dict]) -> dict[str, int]:
    return {name: count for name, count in checker.check(records).found.items() if count}


def test_a_clean_history_passes_every_invariant_and_each_was_exercised():
    report = checker.check(clean())

    assert report.violations == []
    assert all(report.checks[name] > 0 for name in checker.INVARIANTS), report.checks
    assert report.operations["messages_acked"] == 3
    assert report.operations["resumes"] == 1


def test_a_ghost_is_caught_by_convergence():
    # u2 left for good, but u1 was never told.
    records = clean()
    records = without(records, [changed(6.9, "a/u1#0.1", "u2", OFFLINE), changed(10.15, "a/u1#0.1", "u2", ONLINE)])
    records = [r for r in records if r.get("conn") != "a/u2#0.2" and "u2#0.2" not in str(r)]

    assert found(records) == {"convergence": 1}


def test_a_false_offline_is_caught():
    # u1 never left, yet u2's resumed connection was told u1 is offline (and then online again).
    records = [*clean(), changed(15.0, "a/u2#0.2", "u1", OFFLINE), changed(15.5, "a/u2#0.2", "u1", ONLINE)]

    assert found(records) == {"no_false_offline": 1}


def test_a_duplicate_online_is_caught():
    records = [*clean(), changed(10.2, "a/u1#0.1", "u2", ONLINE)]

    assert found(records) == {"one_frame_per_transition": 1}


def test_a_duplicate_inside_a_fault_window_is_excused_and_outside_it_is_not():
    records = [*clean(), changed(10.2, "a/u1#0.1", "u2", ONLINE)]
    fault = {"k": "fault", "t": 8.0, "t_end": 9.0, "fault": "redis_restart", "target": None}

    assert found([*records, fault]) == {}
    assert found(records) == {"one_frame_per_transition": 1}


def test_a_gap_in_live_messages_is_caught():
    lost = recv(11.05, "a/u1#0.1", "message.created", id="m2", channel="ca", seq=2, user="u1", text="hi")

    report = checker.check(without(clean(), [lost]))

    assert report.found["messages"] == 2
    assert [violation.summary for violation in report.violations] == [
        "connection a/u1#0.1 got seqs 1 and 3 of ca, and never 2..2",
        "connection a/u1#0.1 of a member was open around the ack of seq 2 of ca (t=11.05s) and never got it",
    ]


def test_live_messages_out_of_seq_order_are_counted_but_allowed():
    # Sent through different instances, two live messages race on the channel layer; the contract
    # orders a resume's backlog only, and clients put live ones in order.
    swapped = moved(moved(clean(), "a/u1#0.1", "message.created", 2, 12.06), "a/u1#0.1", "message.created", 3, 11.06)

    report = checker.check(swapped)

    assert report.found["messages"] == 0
    assert report.operations["live_reorders"] == 1


def test_a_gap_whose_missing_message_was_acked_just_before_the_close_is_not_caught():
    # u1 got seqs 2 and 4 but not 3, whose ack (u2's reader was slow) came less than the slack
    # before u1 closed: seq 3 may still have been on its way, overtaken by seq 4 on the channel layer.
    missed = recv(12.05, "a/u1#0.1", "message.created", id="m3", channel="ca", seq=3, user="u2", text="hi")
    records = in_order([*without(clean(), [missed]), *message(13.0, "a/u2#0.2", 4, ["a/u1#0.1", "a/u2#0.2"])])

    def acked_at(t: float) -> list[dict]:
        return moved(records, "a/u2#0.2", "message.ack", 3, t)

    assert found(acked_at(25.5)) == {}
    # Acked more than the slack before the close, it was owed: the gap and the live check both say so.
    summaries = [violation.summary for violation in checker.check(acked_at(24.5)).violations]
    assert summaries == [
        "connection a/u1#0.1 got seqs 2 and 4 of ca, and never 3..3",
        "connection a/u1#0.1 of a member was open around the ack of seq 3 of ca (t=24.50s) and never got it",
    ]


def test_a_late_frame_of_a_message_stored_before_a_connection_without_a_cursor_opened_is_no_gap():
    # a1 opens at 12.5 without a cursor. Seq 2's live frame comes late (at 12.6), then seq 4: seq 3,
    # sent at 12.0, before a1 was in, may have gone out before a1 listened: not owed. With a cursor it was.
    a1 = "a/a1#0.1"

    def with_a1(cursor: dict | None) -> list[dict]:
        return in_order(
            [
                *clean(),
                *connected(12.5, a1, "a", "a1", ["a1", "u1", "u2"], cursor),
                changed(12.65, "a/u1#0.1", "a1", ONLINE),
                changed(12.65, "a/u2#0.2", "a1", ONLINE),
                recv(12.6, a1, "message.created", id="m2", channel="ca", seq=2, user="u1", text="hi"),
                *message(13.0, "a/u2#0.2", 4, ["a/u1#0.1", "a/u2#0.2", a1]),
                closed(26.0, a1),
            ]
        )

    assert found(with_a1(None)) == {}
    summaries = [violation.summary for violation in checker.check(with_a1({"ca": 1})).violations]
    assert summaries == ["connection a/a1#0.1 got seqs 2 and 4 of ca, and never 3..3"]


def test_a_message_acked_late_to_a_stalled_sender_is_owed_to_connections_open_since_it_was_sent():
    # u1's reader stalls from 11 s to 14 s: seq 2, stored at once, has its ack read at 14 s.
    records = moved(clean(), "a/u1#0.1", "message.ack", 2, 14.0)
    records.append({"k": "fault", "t": 11.0, "t_end": 14.0, "fault": "stall", "target": "a/u1#0.1"})

    def with_a1(at: float, online: list[str], heard: list[dict]) -> list[dict]:
        """a1 connects at `at`, is announced to the others, hears `heard` and closes with the rest."""
        a1 = "a/a1#0.1"
        joined = [
            *connected(at, a1, "a", "a1", online),
            changed(at + 0.15, "a/u1#0.1", "a1", ONLINE),
            changed(max(at, 10.0) + 0.15, "a/u2#0.2", "a1", ONLINE),
            *heard,
            closed(26.0, a1),
        ]
        return in_order([*records, *joined])

    # Connected after the send, before the ack: the message was stored before it was there.
    assert found(with_a1(12.5, ["a1", "u1", "u2"], [])) == {}
    # Connected before the send, it is owed the message.
    seq_3 = recv(12.05, "a/a1#0.1", "message.created", id="m3", channel="ca", seq=3, user="u2", text="hi")
    before = with_a1(9.0, ["a1", "u1"], [changed(10.15, "a/a1#0.1", "u2", ONLINE), seq_3])
    assert found(before) == {"messages": 1}


def test_a_resume_whose_backlog_comes_after_a_live_message_is_caught():
    # u2 resumed from 0 after seq 1 was stored; a live seq 2 overtook the backlog.
    records = [
        {**record, "cursor": {"ca": 0}} if record["k"] == "open" and record["conn"] == "a/u2#0.2" else record
        for record in clean()
    ]
    records = in_order(
        [
            *records,
            recv(10.12, "a/u2#0.2", "message.created", id="mz", channel="ca", seq=9, user="u1", text="hi"),
            recv(10.13, "a/u2#0.2", "message.created", id="m1", channel="ca", seq=1, user="u2", text="hi"),
        ]
    )

    summaries = [violation.summary for violation in checker.check(records).violations]

    assert any("not in seq order before live messages" in summary for summary in summaries), summaries


def test_a_resume_whose_first_live_messages_race_each_other_is_not_a_skip():
    # u2 resumed from 1 with nothing stored after it; seq 2 and 3 are stored after the connect and
    # reach u2 out of order (live messages race on the channel layer): seq 3 arrives first.
    report = checker.check(moved(clean(), "a/u2#0.2", "message.created", 2, 12.1))

    assert report.found["messages"] == 0
    assert report.operations["live_reorders"] == 1


def test_a_message_delivered_twice_is_caught():
    records = [*clean(), recv(12.5, "a/u1#0.1", "message.created", id="m3", channel="ca", seq=3, user="u2", text="hi")]

    assert found(records) == {"messages": 1}


def test_a_resume_that_skips_the_first_missed_message_is_caught():
    # u2 resumed from 0 although seq 1 was stored before it connected.
    records = [
        {**record, "cursor": {"ca": 0}} if record["k"] == "open" and record["conn"] == "a/u2#0.2" else record
        for record in clean()
    ]

    assert found(records) == {"messages": 1}


def test_a_frame_naming_another_tenants_user_or_channel_is_caught():
    records = [
        *clean(),
        changed(13.0, "b/u1#0.1", "a1", ONLINE),
        recv(13.5, "b/u1#0.1", "message.created", id="mx", channel="ca", seq=9, user="u1", text="hi"),
    ]

    report = checker.check(records)
    assert report.found["tenant_walls"] == 2
    assert report.found["reach"] == 0


def test_presence_about_someone_who_shares_no_channel_is_caught():
    # Tenant b's u1 hears of u2 (who exists only in tenant a) through a wall;
    # and a1, in tenant a, is removed from "ca" before u1 hears of them.
    removal = {"k": "member", "t": 13.0, "t_end": 13.1, "tenant": "a", "channel": "ca", "user": "a1", "op": "remove"}
    records = [*clean(), {**removal, "status": 204}, changed(20.0, "a/u1#0.1", "a1", ONLINE)]

    assert found(records) == {"reach": 1}


def test_a_frame_a_stalled_reader_reads_as_it_resumes_is_judged_from_the_stall():
    # u2 is removed from "ca" at 13 s. Its reader stalled from 12 s to 16 s, and reads as it
    # resumes the message u1 sent at 12.4 s, written to its socket before the removal.
    removal = {"k": "member", "t": 13.0, "t_end": 13.1, "tenant": "a", "channel": "ca", "user": "u2", "op": "remove"}
    records = moved(
        in_order([*clean(), {**removal, "status": 204}, *message(12.4, "a/u1#0.1", 4, ["a/u1#0.1", "a/u2#0.2"])]),
        "a/u2#0.2",
        "message.created",
        4,
        16.0,
    )

    def stalled(until: float) -> list[dict]:
        return in_order([*records, {"k": "fault", "t": 12.0, "t_end": until, "fault": "stall", "target": "a/u2#0.2"}])

    assert found(stalled(16.0)) == {}
    # A stall that ended more than the slack before the frame was read does not excuse it.
    assert found(stalled(13.5)) == {"reach": 1}


def test_a_traceback_in_an_instance_log_is_caught():
    line = {"k": "log", "instance": "gw2", "text": "Traceback (most recent call last):\n  ...\nKeyError: 'x'"}

    report = checker.check([*clean(), line])

    assert report.found == {**{name: 0 for name in checker.INVARIANTS}, "no_traceback": 1}


def test_a_violation_says_the_seed_the_invariant_an_excerpt_and_how_to_replay_it():
    report = checker.check([*clean(), changed(10.2, "a/u1#0.1", "u2", ONLINE)])

    text = checker.describe(report, "var/chaos/7")

    assert "seed=7 invariant=one_frame_per_transition" in text
    assert "'presence.changed'" in text
    assert "python -m chaos --seed 7 --minutes 1 --users 4" in text
    assert "python -m chaos check var/chaos/7" in text


@pytest.mark.parametrize("status", [None, 500])
def test_a_membership_change_with_an_unknown_outcome_is_not_judged(status):
    # The removal may or may not have happened: u1 hearing of a1 afterwards proves nothing.
    removal = {"k": "member", "t": 13.0, "t_end": 13.1, "tenant": "a", "channel": "ca", "user": "a1", "op": "remove"}
    records = [*clean(), {**removal, "status": status}, changed(20.0, "a/u1#0.1", "a1", ONLINE)]

    assert found(records) == {}
