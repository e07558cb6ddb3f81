"""The console's pure state: sessions (bounded, expiring, CSRF compared in constant
time) and the charts' history (bounded rings; rates never negative)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.doors.console.history import Sample, TopicHistory
from danube_zmq.doors.console.sessions import FLASHES_MAX, SessionStore


def test_sessions_are_bounded_and_evict_the_least_recently_seen() -> None:
    store = SessionStore(sessions_max=3)
    first, second, third = (store.create(None, now_s=0) for _ in range(3))
    assert store.get(first.session_id, now_s=1) is first  # seen: second is now the oldest
    fourth = store.create("t", now_s=2)
    assert len(store) == 3 and store.get(second.session_id, now_s=2) is None
    assert {s.session_id for s in (first, third, fourth)} == {
        sid for sid in (first.session_id, third.session_id, fourth.session_id) if store.get(sid, now_s=2)}


def test_sessions_end_when_idle_and_at_their_lifetime() -> None:
    store = SessionStore(idle_s=10, lifetime_s=25)
    session = store.create("t", now_s=0)
    assert store.get(session.session_id, now_s=9) is session
    assert store.get(session.session_id, now_s=18) is session
    assert store.get(session.session_id, now_s=26) is None  # used all along, but too old
    idle = store.create("t", now_s=100)
    assert store.get(idle.session_id, now_s=111) is None
    assert store.get(idle.session_id, now_s=100) is None  # forgotten, not revived


def test_session_ids_and_csrf_tokens_are_unguessable_and_checked() -> None:
    store = SessionStore()
    a, b = store.create(None, 0), store.create(None, 0)
    assert a.session_id != b.session_id and a.csrf != b.csrf and len(a.csrf) >= 40
    assert a.csrf_ok(a.csrf) and not a.csrf_ok(b.csrf) and not a.csrf_ok("") and not a.csrf_ok(None)
    assert store.get(None, 0) is None and store.get("", 0) is None and store.get("nope", 0) is None


def test_flashes_are_bounded_and_shown_once() -> None:
    session = SessionStore().create(None, 0)
    for index in range(FLASHES_MAX + 5):
        session.flash("ok", str(index))
    taken = session.take_flashes()
    assert len(taken) == FLASHES_MAX and taken[-1] == ("ok", str(FLASHES_MAX + 4))
    assert session.take_flashes() == []


def test_store_refuses_a_zero_bound() -> None:
    with pytest.raises(ValueError):
        SessionStore(sessions_max=0)


samples = st.lists(st.tuples(st.floats(0, 5, allow_nan=False), st.integers(0, 10**6), st.integers(0, 10**6),
                             st.sampled_from(["/a/x", "/a/y", "/a/z"])), max_size=200)


@given(samples)
def test_history_is_bounded_and_its_rates_are_never_negative(steps: list[tuple[float, int, int, str]]) -> None:
    history = TopicHistory(topics_max=2, points_max=5, interval_s=0.5)
    now = 0.0
    for advance, messages_in, messages_out, topic in steps:
        now += advance
        history.record(topic, Sample(at_s=now, backlog_messages=1, backlog_bytes=2, unacked_messages=0,
                                     messages_in=messages_in, messages_out=messages_out))
    kept = [topic for topic in ("/a/x", "/a/y", "/a/z") if history.series(topic)["time_ms"]]
    assert len(kept) <= 2
    for topic in kept:
        series = history.series(topic)
        assert 1 <= len(series["time_ms"]) <= 5
        assert series["time_ms"] == sorted(series["time_ms"])
        assert all(b - a >= 500 for a, b in zip(series["time_ms"], series["time_ms"][1:], strict=False))
        for rate in series["in_rate"] + series["out_rate"]:
            assert rate is None or rate >= 0
        assert series["in_rate"][0] is None


def test_history_rates_follow_the_counters_and_skip_a_reset() -> None:
    history = TopicHistory(interval_s=1)
    for at, messages_in in ((0, 100), (2, 300), (4, 50)):  # the topic moved: its counter began again
        history.record("/a/t", Sample(at_s=at, backlog_messages=0, backlog_bytes=0, unacked_messages=0,
                                      messages_in=messages_in, messages_out=0))
    assert history.series("/a/t")["in_rate"] == [None, 100.0, None]
    history.forget("/a/t")
    assert history.series("/a/t")["time_ms"] == []


def test_the_console_answers_to_its_listen_address_loopback_and_the_names_given() -> None:
    from danube_zmq.doors.console.app import _host_name, console_hosts

    assert _host_name("Evil.Example:8780") == "evil.example"
    assert _host_name("[::1]:8780") == "::1"
    assert _host_name("::1") == "::1"
    hosts = console_hosts("10.0.0.5", ("console.example.com:443",))
    assert {"10.0.0.5", "localhost", "127.0.0.1", "::1", "console.example.com"} == hosts
    assert "127.0.0.1" in console_hosts("0.0.0.0") and "evil.example" not in console_hosts("0.0.0.0")
