"""The chaos checkers (tests/chaos/harness/checkers.py) and history files (tests/chaos/harness/history.py) on
generated histories whose answers are known.

`simulate` plays a seeded run of the system as it should behave (producers send with
ok / fail / unknown outcomes and retried duplicates, a log per partition assigns
offsets, every subscription delivers every stored message with redeliveries and
consumer restarts), recording the history the workload would. A correct run must be
judged valid with the exact duplicate count; each test then breaks one thing (drops
an acknowledged delivery, invents a message, swaps an order, reuses an offset, skips
offsets) and checks the checker names it and only it.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.transport.errors import InvalidArgument, ResourceExhausted
from tests.chaos.harness.checkers import (
    Fault,
    Report,
    check_availability,
    check_leaders,
    check_offsets,
    check_order,
    check_queue,
    check_raft,
    check_run,
    metadata_operations,
)
from tests.chaos.harness.history import HistoryWriter, Op, load_history, pair_ops

SEEDS = st.integers(0, 2**32 - 1)
SUB_TYPES = ("exclusive", "shared", "failover")


@dataclass
class Run:
    ops: list[Op] = field(default_factory=list)
    duplicates: int = 0
    acked: set[tuple[str, int]] = field(default_factory=set)
    stored: dict[str, list[tuple[int, tuple[str, int]]]] = field(default_factory=dict)  # topic -> (offset, message)
    faults: list[Fault] = field(default_factory=list)
    subs: dict[str, str] = field(default_factory=dict)  # subscription -> type

    def add(self, type: str, process: str, f: str, value: dict, time_ns: int) -> None:
        self.ops.append(Op(type=type, process=process, f=f, value=value, time_ns=time_ns))


def simulate(seed: int, *, producers: int = 2, messages: int = 60, partitions: int = 1, subs: int = 3,
             skips: bool = False) -> Run:
    """A correct run (module docstring). `skips`: the log jumps past some offsets
    (a takeover past a reservation), each inside an injected fault's window."""
    rng = random.Random(seed)
    run = Run()
    topic = "/default/chaos"
    parts = [f"{topic}-part-{i}" for i in range(partitions)] if partitions > 1 else [topic]
    run.stored = {p: [] for p in parts}
    next_offset = dict.fromkeys(parts, 0)
    t = 1_000
    seqs = [0] * producers
    remaining = producers * messages
    while remaining:
        p = rng.choice([i for i in range(producers) if seqs[i] < messages])
        seq = seqs[p]
        seqs[p] += 1
        remaining -= 1
        name = f"producer-{p}"
        part = parts[seq % len(parts)]
        message = (name, seq)
        skipped = skips and rng.random() < 0.05
        if skipped:  # a kill, healed before this send, which is acknowledged past the skip
            run.faults.append(Fault("kill", t, t + 1))
            next_offset[part] += rng.randint(1, 5000)
            t += 3
        run.add("invoke", name, "send", {"producer": name, "seq": seq, "topic": topic, "reliable": True}, t)
        outcome = rng.choices(["ok", "fail", "info_stored", "info_lost", "ok_twice"], [70, 8, 8, 7, 7])[0] if not skipped else "ok"
        offset = None
        for _ in range({"ok": 1, "ok_twice": 2, "info_stored": 1}.get(outcome, 0)):
            offset = next_offset[part]
            next_offset[part] += 1
            run.stored[part].append((offset, message))
        t += rng.randint(1, 4)
        if outcome.startswith("ok"):
            run.acked.add(message)
            run.add("ok", name, "send", {"producer": name, "seq": seq, "topic": part, "offset": offset}, t)
        elif outcome == "fail":
            run.add("fail", name, "send", {"producer": name, "seq": seq, "error": "INVALID_ARGUMENT"}, t)
        elif rng.random() < 0.7:  # else the process stopped with it in flight: no completion at all
            run.add("info", name, "send", {"producer": name, "seq": seq, "error": "TIMEOUT"}, t)
    for s in range(subs):
        sub, sub_type = f"sub-{s}", SUB_TYPES[s % len(SUB_TYPES)]
        run.subs[sub] = sub_type
        generation = 0
        t += 1
        run.add("ok", f"consumer-{s}.{generation}", "subscribe", {"subscription": sub, "sub_type": sub_type}, t)
        for part in parts:
            delivered: list[tuple[int, tuple[str, int]]] = []
            for offset, message in run.stored[part]:
                t += 1
                seen_before = any(m == message for _, m in delivered)
                run.add("ok", f"consumer-{s}.{generation}", "deliver", _deliver(sub, sub_type, part, offset, message, 0), t)
                run.duplicates += seen_before  # a retried send stored twice
                delivered.append((offset, message))
                if rng.random() < 0.04:  # the consumer restarts: its unacked tail comes again
                    generation += 1
                    for again_offset, again in delivered[-rng.randint(1, 3):]:
                        t += 1
                        run.add("ok", f"consumer-{s}.{generation}", "deliver",
                                _deliver(sub, sub_type, part, again_offset, again, 1), t)
                        run.duplicates += 1
                elif rng.random() < 0.03:  # an ack timeout: one earlier message again
                    again_offset, again = rng.choice(delivered)
                    t += 1
                    run.add("ok", f"consumer-{s}.{generation}", "deliver",
                            _deliver(sub, sub_type, part, again_offset, again, 1), t)
                    run.duplicates += 1
    return run


def _deliver(sub: str, sub_type: str, topic: str, offset: int, message: tuple[str, int], redelivery: int) -> dict:
    return {"subscription": sub, "sub_type": sub_type, "producer": message[0], "seq": message[1], "topic": topic,
            "offset": offset, "redelivery": redelivery}


def _without(ops: list[Op], drop) -> list[Op]:
    return [op for op in ops if not drop(op)]


# -- a correct run -------------------------------------------------------------


@settings(max_examples=60)
@given(seed=SEEDS, partitions=st.integers(1, 3), skips=st.booleans())
def test_a_correct_run_is_valid_with_its_exact_duplicates(seed: int, partitions: int, skips: bool) -> None:
    """Every checker passes a correct run, unknown and failed sends, retried duplicates,
    redeliveries, consumer restarts and fault-covered offset skips included; the
    duplicates are counted exactly."""
    run = simulate(seed, partitions=partitions, skips=skips)
    report = check_run("B1", run.ops, run.faults)
    assert report.valid, report.findings
    assert report.duplicates == run.duplicates
    assert report.acked == len(run.acked)
    assert report.lost == report.unexpected == report.nonmonotonic == report.inconsistent_offsets == 0
    assert report.offset_gaps_unexplained == 0
    if not skips:
        assert report.offset_gaps_explained == 0


# -- the queue checker ---------------------------------------------------------


@settings(max_examples=40)
@given(seed=SEEDS, data=st.data())
def test_an_acknowledged_message_never_delivered_on_one_subscription_is_lost(seed: int, data) -> None:
    """Dropping every delivery of one acknowledged message on one subscription makes
    exactly that (subscription, message) lost."""
    run = simulate(seed)
    victim = data.draw(st.sampled_from(sorted(run.acked)))
    sub = data.draw(st.sampled_from(sorted(run.subs)))
    ops = _without(run.ops, lambda op: op.f == "deliver" and op.value["subscription"] == sub
                   and (op.value["producer"], op.value["seq"]) == victim)
    result = check_queue(ops)
    assert result.lost == 1
    assert result.lost_examples == ((sub, victim),)
    assert not check_run("x", ops).valid


@settings(max_examples=40)
@given(seed=SEEDS)
def test_unknown_and_failed_sends_never_count_as_lost(seed: int) -> None:
    """Messages whose send was `info` or `fail` may be missing on every subscription:
    nothing is lost; those of them delivered count as recovered or failed_delivered."""
    run = simulate(seed)
    ops = _without(run.ops, lambda op: op.f == "deliver" and (op.value["producer"], op.value["seq"]) not in run.acked)
    assert check_queue(ops).lost == 0
    assert check_queue(ops).recovered == 0
    full = check_queue(run.ops)
    delivered = {(op.value["producer"], op.value["seq"]) for op in run.ops if op.f == "deliver"}
    assert full.recovered + full.failed_delivered == len(delivered - run.acked)


@settings(max_examples=40)
@given(seed=SEEDS, producer=st.sampled_from(["producer-0", "stranger"]))
def test_a_delivery_never_sent_is_unexpected(seed: int, producer: str) -> None:
    """A delivered message no producer ever attempted (a seq past the last, or an
    unknown producer), and an unreadable payload, are each one unexpected."""
    run = simulate(seed)
    ops = [*run.ops,
           Op(type="ok", process="consumer-0.9", f="deliver", time_ns=10**9,
              value=_deliver("sub-0", "exclusive", "/default/chaos", 10**6, (producer, 10**6), 0)),
           Op(type="ok", process="consumer-0.9", f="deliver", time_ns=10**9 + 1,
              value={"subscription": "sub-0", "sub_type": "exclusive", "producer": None, "seq": None,
                     "topic": "/default/chaos", "offset": 10**6 + 1, "redelivery": 0})]
    result = check_queue(ops)
    assert result.unexpected == 2
    assert result.lost == 0


def test_a_subscription_that_received_nothing_loses_everything_acknowledged() -> None:
    """A subscription known only from its `subscribe` record still counts: every
    acknowledged message is lost on it."""
    run = simulate(3, subs=1)
    ops = [*run.ops, Op(type="ok", process="consumer-9.0", f="subscribe", time_ns=1,
                        value={"subscription": "silent", "sub_type": "shared"})]
    assert check_queue(ops).lost == len(run.acked)


# -- order ---------------------------------------------------------------------


@settings(max_examples=40)
@given(seed=SEEDS, sub_type=st.sampled_from(SUB_TYPES))
def test_first_deliveries_out_of_send_order_are_reported_on_exclusive_and_failover(seed: int, sub_type: str) -> None:
    """Swapping the times of two first deliveries of one producer is nonmonotonic on an
    Exclusive or Failover subscription, and allowed on a Shared one."""
    run = simulate(seed, subs=1, producers=1)
    ops = [op if op.f != "deliver" else Op(type=op.type, process=op.process, f=op.f, time_ns=op.time_ns,
                                          value={**op.value, "sub_type": sub_type}) for op in run.ops]
    firsts = [i for i, op in enumerate(ops) if op.f == "deliver" and op.value["redelivery"] == 0]
    seqs = [ops[i].value["seq"] for i in firsts]
    assert seqs == sorted(seqs)
    i, j = firsts[3], firsts[10]
    if seqs[3] == seqs[10]:
        return  # a message stored twice: swapping its copies changes nothing
    ops[i], ops[j] = (Op(type="ok", process=ops[j].process, f="deliver", value=ops[j].value, time_ns=ops[i].time_ns),
                      Op(type="ok", process=ops[i].process, f="deliver", value=ops[i].value, time_ns=ops[j].time_ns))
    result = check_order(ops)
    if sub_type == "shared":
        assert result.nonmonotonic == 0
    else:
        assert result.nonmonotonic >= 1
        assert result.examples[0][1] == "producer-0"


def test_a_redelivery_of_an_earlier_message_is_not_out_of_order() -> None:
    """Exclusive: 0, 1, 2, then 1 again (redelivered after a consumer restart), then 3:
    in order. 0, 2, 1 is one finding naming (2, 1)."""
    def deliveries(seqs: list[int]) -> list[Op]:
        return [Op(type="ok", process="c", f="deliver", time_ns=t,
                   value=_deliver("s", "exclusive", "/t", seq, ("p", seq), 0)) for t, seq in enumerate(seqs)]

    assert check_order(deliveries([0, 1, 2, 1, 3])).nonmonotonic == 0
    result = check_order(deliveries([0, 2, 1]))
    assert (result.nonmonotonic, result.examples) == (1, (("s", "p", "/t", 2, 1),))


# -- offsets -------------------------------------------------------------------


@settings(max_examples=40)
@given(seed=SEEDS, data=st.data())
def test_a_delivery_at_an_acknowledged_offset_with_another_message_is_inconsistent(seed: int, data) -> None:
    """Moving one delivery onto the offset another message was acknowledged at: an
    inconsistent offset, and an acknowledged one reused."""
    run = simulate(seed, producers=1)
    acks = [op for op in run.ops if op.f == "send" and op.type == "ok"]
    target = data.draw(st.sampled_from(acks))
    deliveries = [i for i, op in enumerate(run.ops) if op.f == "deliver"
                  and (op.value["producer"], op.value["seq"]) != (target.value["producer"], target.value["seq"])]
    i = data.draw(st.sampled_from(deliveries))
    ops = list(run.ops)
    ops[i] = Op(type="ok", process=ops[i].process, f="deliver", time_ns=ops[i].time_ns,
                value={**ops[i].value, "topic": target.value["topic"], "offset": target.value["offset"]})
    result = check_offsets(ops)
    assert result.inconsistent >= 1
    assert result.acked_reused >= 1
    assert not result.valid


def test_offsets_of_non_reliable_topics_are_not_checked() -> None:
    """Two messages at one offset of a non-reliable topic (its offsets may repeat after a
    restart) are no finding; the same on a reliable topic is one."""
    def history(reliable: bool) -> list[Op]:
        ops = []
        for seq in (0, 1):
            ops.append(Op(type="invoke", process="p", f="send", time_ns=seq * 10,
                          value={"producer": "p", "seq": seq, "topic": "/t", "reliable": reliable}))
            ops.append(Op(type="ok", process="p", f="send", time_ns=seq * 10 + 1,
                          value={"producer": "p", "seq": seq, "topic": "/t", "offset": 0}))
        return ops

    assert check_offsets(history(False)).inconsistent == 0
    assert check_offsets(history(True)).inconsistent == 1


def _two_acks_with_a_gap(between: list[Op]) -> list[Op]:
    ops = [Op(type="invoke", process="p", f="send", time_ns=10, value={"producer": "p", "seq": 0, "topic": "/t"}),
           Op(type="ok", process="p", f="send", time_ns=11, value={"producer": "p", "seq": 0, "topic": "/t", "offset": 7}),
           *between,
           Op(type="invoke", process="p", f="send", time_ns=20, value={"producer": "p", "seq": 1, "topic": "/t"}),
           Op(type="ok", process="p", f="send", time_ns=30,
              value={"producer": "p", "seq": 1, "topic": "/t", "offset": 4_000_000})]
    return sorted(ops, key=lambda op: op.time_ns)


def test_an_offset_gap_is_a_warning_only_with_a_failed_send_or_a_fault_around_it() -> None:
    """Acknowledged offsets 7 and 4,000,000 with nothing seen between: an error alone, a
    warning when a send went unknown in between or a fault overlaps; the gap is named
    by its first and last missing offset."""
    alone = check_offsets(_two_acks_with_a_gap([]))
    assert (alone.gaps_unexplained, alone.gaps_explained) == (1, 0)
    assert alone.gap_examples == (("/t", 8, 3_999_999, False),)
    unknown = check_offsets(_two_acks_with_a_gap([
        Op(type="invoke", process="q", f="send", time_ns=15, value={"producer": "q", "seq": 0, "topic": "/t"}),
        Op(type="info", process="q", f="send", time_ns=16, value={"producer": "q", "seq": 0, "error": "TIMEOUT"})]))
    assert (unknown.gaps_unexplained, unknown.gaps_explained) == (0, 1)
    faulted = check_offsets(_two_acks_with_a_gap([]), [Fault("kill", 25, 40)])
    assert (faulted.gaps_unexplained, faulted.gaps_explained) == (0, 1)
    before = check_offsets(_two_acks_with_a_gap([]), [Fault("kill", 1, 5)])
    assert before.gaps_unexplained == 1


def test_offsets_seen_only_in_deliveries_fill_a_gap() -> None:
    """Offsets between two acknowledged ones that were delivered (stored, their acks
    lost) are no gap."""
    ops = _two_acks_with_a_gap([])
    ops = [op if op.value.get("offset") != 4_000_000 else
           Op(type=op.type, process=op.process, f=op.f, time_ns=op.time_ns, value={**op.value, "offset": 10})
           for op in ops]
    ops += [Op(type="ok", process="c", f="deliver", time_ns=40 + o,
               value=_deliver("s", "shared", "/t", o, ("r", o), 0)) for o in (8, 9)]
    assert check_offsets(ops).gaps_unexplained == 0


# -- availability --------------------------------------------------------------


@settings(max_examples=40)
@given(seed=SEEDS)
def test_recovery_is_the_time_from_each_heal_to_the_next_ack_and_delivery(seed: int) -> None:
    """Against a brute-force scan: for every fault, the first acknowledged send and the
    first delivery at or after its heal; None when there is none."""
    rng = random.Random(seed)
    run = simulate(seed, messages=30)
    end = max(op.time_ns for op in run.ops)
    faults = [Fault(f"f{i}", h - 3, h) for i, h in enumerate(sorted(rng.sample(range(5, end + 50), 4)))]
    result = check_availability(run.ops, faults)
    for fault, ack, delivery in zip(faults, result.ack_after_heal_ns, result.delivery_after_heal_ns, strict=True):
        acks = [op.time_ns - fault.heal_ns for op in run.ops
                if op.f == "send" and op.type == "ok" and op.time_ns >= fault.heal_ns]
        delivered = [op.time_ns - fault.heal_ns for op in run.ops
                     if op.f == "deliver" and op.time_ns >= fault.heal_ns]
        assert ack == (min(acks) if acks else None)
        assert delivery == (min(delivered) if delivered else None)


# -- Raft ----------------------------------------------------------------------


@settings(max_examples=60)
@given(seed=SEEDS, split=st.booleans())
def test_two_leaders_in_one_term_are_reported(seed: int, split: bool) -> None:
    """Observations with one leader per term (followers and candidates everywhere) pass;
    a second node seen leading one of those terms is reported with both nodes."""
    rng = random.Random(seed)
    observations = []
    for term in range(1, 20):
        leader = rng.randint(1, 5)
        observations += [(leader, term, "leader")] * rng.randint(1, 3)
        observations += [(n, term, rng.choice(["follower", "candidate"])) for n in range(1, 6) if n != leader]
    rng.shuffle(observations)
    bad_term = rng.randint(1, 19)
    if split:
        others = [n for n, t, r in observations if t == bad_term and r != "leader"]
        observations.append((others[0], bad_term, "leader"))
    terms, split_terms = check_leaders(observations)
    assert terms == 19
    assert [t for t, _ in split_terms] == ([bad_term] if split else [])


def _metadata(calls: list[tuple[str, str, str, dict, dict | None, int, int | None]]) -> list[Op]:
    """(process, f, type-of-completion, invoke value, completion value, invoke, complete)."""
    ops = []
    for process, f, done_type, value, result, invoke, complete in calls:
        ops.append(Op(type="invoke", process=process, f=f, value=value, time_ns=invoke))
        if complete is not None:
            ops.append(Op(type=done_type, process=process, f=f, value=result or {}, time_ns=complete))
    return sorted(ops, key=lambda op: op.time_ns)


def test_metadata_histories_reach_the_linearizability_checker() -> None:
    """put a=1 completes, then a get returns the older value: not linearizable. The same
    with the put unknown (`info`) is. A failed put is left out, an unknown one kept with
    no completion; a cas carries its expected value and result."""
    stale = _metadata([("a0", "put", "ok", {"key": "a", "value": "1"}, None, 0, 10),
                       ("a1", "get", "ok", {"key": "a"}, {"result": None}, 20, 30)])
    assert check_raft(stale).linearizable is False
    unknown = _metadata([("a0", "put", "info", {"key": "a", "value": "1"}, None, 0, 10),
                         ("a1", "get", "ok", {"key": "a"}, {"result": None}, 20, 30)])
    assert check_raft(unknown).linearizable is True
    ops = _metadata([("a0", "put", "fail", {"key": "a", "value": "1"}, None, 0, 10),
                     ("a0", "put", "info", {"key": "a", "value": "2"}, None, 11, 12),
                     ("a1", "cas", "ok", {"key": "a", "value": "3", "expected": "2"}, {"result": True}, 20, 30),
                     ("a1", "get", "ok", {"key": "a"}, {"result": "3"}, 31, 32)])
    built = metadata_operations(ops)
    assert [(o.op, o.value, o.complete is None) for o in built] == [
        ("put", b"2", True), ("cas", b"3", False), ("get", None, False)]
    assert built[1].expected == b"2" and built[1].result is True and built[2].result == b"3"
    assert check_raft(ops).linearizable is True


# -- the report ----------------------------------------------------------------


def test_reports_merge_and_render_one_row() -> None:
    """Merging two runs sums their counts and keeps every recovery sample, so the p50
    and max in the row are those of all runs."""
    a = Report(scenario="B1", faults=1, acked=100, duplicates=2, recovery_ack_ms=(100.0,))
    b = Report(scenario="B1", faults=1, acked=50, lost=1, recovery_ack_ms=(300.0, 200.0))
    merged = a.merge(b)
    assert (merged.runs, merged.faults, merged.acked, merged.lost, merged.duplicates) == (2, 2, 150, 1, 2)
    assert not merged.valid and a.valid
    assert merged.row() == "| B1 | 2 | 2 | 150 | 1 | 2 | 0 | 0 | 0 | 200 / 300 | - |"
    assert Report.HEADER.splitlines()[0].count("|") == merged.row().count("|")


# -- history files -------------------------------------------------------------


@settings(max_examples=30)
@given(seed=SEEDS)
def test_histories_written_per_process_load_back_in_time_order(tmp_path_factory, seed: int) -> None:
    """A simulated run written through one HistoryWriter per process loads back as the
    same ops in time order."""
    directory = tmp_path_factory.mktemp("history")
    run = simulate(seed, messages=20)
    writers: dict[str, HistoryWriter] = {}
    for op in run.ops:
        writer = writers.setdefault(op.process, HistoryWriter(directory, op.process))
        writer.append(op.type, op.f, op.value, op.time_ns)
    for writer in writers.values():
        writer.close()
    loaded = load_history(directory)
    assert sorted(loaded, key=lambda o: (o.time_ns, o.process, o.f, o.type)) == \
        sorted(run.ops, key=lambda o: (o.time_ns, o.process, o.f, o.type))
    assert [o.time_ns for o in loaded] == sorted(o.time_ns for o in run.ops)


def test_a_torn_last_line_is_dropped_and_a_bad_line_elsewhere_is_an_error(tmp_path: Path) -> None:
    """A process killed mid-write leaves half a line at the end: dropped. A bad line
    followed by others is damage: an error naming file and line."""
    with HistoryWriter(tmp_path, "p") as writer:
        writer.append("invoke", "send", {"producer": "p", "seq": 0}, 5)
    with open(tmp_path / "p.jsonl", "a") as f:
        f.write('{"type":"ok","process":"p","f":"se')
    assert [op.type for op in load_history(tmp_path)] == ["invoke"]
    with open(tmp_path / "p.jsonl", "a") as f:
        f.write("\n" + json.dumps({"type": "ok", "process": "p", "f": "send", "value": {}, "time": 9}) + "\n")
    with pytest.raises(InvalidArgument, match=r"p\.jsonl:2"):
        load_history(tmp_path)


def test_a_history_refuses_records_past_its_bound(tmp_path: Path) -> None:
    """records_max and bytes_max are hard bounds: the record past them is refused with
    ResourceExhausted; bad records are refused with InvalidArgument."""
    writer = HistoryWriter(tmp_path, "p", records_max=2)
    writer.append("invoke", "send", {"seq": 0}, 1)
    writer.append("ok", "send", {"seq": 0}, 2)
    with pytest.raises(ResourceExhausted):
        writer.append("invoke", "send", {"seq": 1}, 3)
    small = HistoryWriter(tmp_path, "q", bytes_max=100)
    with pytest.raises(ResourceExhausted):
        small.append("invoke", "send", {"pad": "x" * 200}, 1)
    with pytest.raises(InvalidArgument):
        small.append("done", "send", {}, 1)
    with pytest.raises(InvalidArgument):
        HistoryWriter(tmp_path, "../escape")
    writer.close()
    small.close()


def test_invocations_pair_with_their_own_completions_when_many_are_in_flight() -> None:
    """Sends 0, 1, 2 in flight at once complete as 2, 0 and never: each invocation
    gets its own completion, the last none; a completion never invoked is an orphan."""
    def op(type: str, seq: int, t: int) -> Op:
        return Op(type=type, process="p", f="send", value={"seq": seq}, time_ns=t)

    pairs, orphans = pair_ops([op("invoke", 0, 1), op("invoke", 1, 2), op("invoke", 2, 3), op("ok", 2, 4),
                               op("fail", 0, 5), op("ok", 7, 6)], "send", "seq")
    assert [(i.value["seq"], d.type if d else None) for i, d in pairs] == [(0, "fail"), (1, None), (2, "ok")]
    assert [o.value["seq"] for o in orphans] == [7]


def test_an_observers_status_records_reach_the_leader_check() -> None:
    """`status` records of an observer process are Election Safety observations in
    check_run: node 2 seen leading term 5 after node 1 did is one split term; a run's
    metadata operations are checked for linearizability there too."""
    def status(node: int, term: int, role: str, t: int) -> Op:
        return Op(type="ok", process="observer", f="status", time_ns=t,
                  value={"node": node, "term": term, "role": role, "leader": node if role == "LEADER" else None})

    calm = [status(1, 5, "LEADER", 1), status(2, 5, "FOLLOWER", 2), status(2, 6, "LEADER", 3)]
    assert check_run("R1", calm).valid
    split = check_run("R1", [*calm, status(2, 5, "LEADER", 4)])
    assert split.split_terms == 1 and not split.valid
    stale = _metadata([("a0", "put", "ok", {"key": "a", "value": "1"}, None, 0, 10),
                       ("a1", "get", "ok", {"key": "a"}, {"result": None}, 20, 30)])
    assert check_run("R1", stale).not_linearizable == 1


def test_b1_criteria_fail_a_late_resume_and_too_many_duplicates() -> None:
    """B1/B2's own criteria (reliability.md 4.2) turn a run the checkers passed invalid:
    a first acknowledgement more than 10 s after a heal (unless the next fault came
    first: B2's kills are 5 s apart), or more duplicates than the consumers could hold
    unacknowledged at the kills (kills x consumers x window); a run within both stays
    valid and unchanged."""
    from tests.chaos.harness.faults import Fault
    from tests.chaos.harness.scenarios import SCENARIOS, _check_criteria
    from tests.chaos.harness.workload import RECEIVER_QUEUE_SIZE

    def kills(*starts: float) -> list[Fault]:
        return [Fault(id=i, kind="kill9", targets=("broker-1",), description="kill", started_at=t,
                      healed_at=t + 0.2) for i, t in enumerate(starts)]

    b1 = SCENARIOS["B1"]
    bound = len(b1.consumers) * RECEIVER_QUEUE_SIZE
    good = Report(scenario="B1", faults=1, acked=3000, duplicates=bound, recovery_ack_ms=(9_999.0,))
    assert _check_criteria(good, b1, kills(10.0)) == good and good.valid
    late = _check_criteria(dataclasses.replace(good, recovery_ack_ms=(10_001.0,)), b1, kills(10.0))
    assert not late.valid and late.criteria_failed == 1
    assert "resumed 10,001 ms after a heal" in late.findings[-1]
    doubled = _check_criteria(dataclasses.replace(good, duplicates=bound + 1), b1, kills(10.0))
    assert not doubled.valid and "duplicates" in doubled.findings[-1]
    assert _check_criteria(dataclasses.replace(good, duplicates=bound + 1), b1, kills(10.0, 20.0)).valid
    # B2: the first kill's 12 s is cut short by the next kill 5 s later; the last one is judged.
    b2 = SCENARIOS["B2"]
    bounced = dataclasses.replace(good, recovery_ack_ms=(12_000.0, 7_000.0))
    assert _check_criteria(bounced, b2, kills(10.0, 15.0)).valid
    assert not _check_criteria(dataclasses.replace(bounced, recovery_ack_ms=(3_000.0, 12_000.0)), b2,
                               kills(10.0, 15.0)).valid
    # Scenarios without these criteria are left alone.
    assert _check_criteria(dataclasses.replace(good, recovery_ack_ms=(60_000.0,)), SCENARIOS["B3"], kills(10.0)).valid
