"""A linearizability checker for key-value histories (Porcupine / Knossos style).

A history is what clients saw: each operation with the time it was invoked and the
time its result came back. It is linearizable if every operation can be given one
instant between its invocation and its completion such that, taken in that order,
the results are those of a single sequential register per key.

Model (kept simple on purpose): per key, a register holding bytes or nothing (None).

    put(key, value)                  -> (result ignored)
    delete(key)                      -> (result ignored)
    get(key)                         -> bytes | None        (None: the key is absent)
    cas(key, expected, value)        -> bool                (expected compares *values*;
                                                             expected None: key absent)

Unknown outcomes (a timeout, a lost connection): `complete=None`, Knossos's "info"
semantics: the operation may have taken effect at any instant after its invocation,
or never; its result is ignored. (A `get` with an unknown outcome constrains nothing
and is dropped.) An operation that definitely failed must be left out of the history.

Algorithm:

1. P-compositionality (Herlihy & Wing): a map of independent registers is
   linearizable iff each key's sub-history is, so the history is split by key and
   each key checked on its own: many small searches instead of one exponential one.
2. Per key, the Wing & Gong search with Lowe's memoization, as in Porcupine: walk
   the call/return events in time order, try to linearize any pending call whose
   model step accepts its result, backtrack when a return is reached for an
   operation not yet linearized; cache (set of linearized operations as a bitmask,
   register state) so an equivalent configuration is never explored twice.
   Operations with an unknown outcome have no return event, so they never force
   backtracking and may stay un-linearized ("never happened").
3. The search is bounded: past `states_max` cached configurations for a key the
   answer is "unknown" (`ok=None`), never a hang.

Times are integers (simulator ticks, or nanoseconds). Equal times count as
overlapping (a completion at t and an invocation at t may be in either order): the
checker never calls a history wrong because of a tie.

On a violation the counterexample is shrunk: read-only operations (gets, failed
cas) are removed one at a time while the key stays non-linearizable. Removing a read
only removes constraints, so the remaining set is still a genuine violation of the
original history. Writes are kept: dropping a write can invent a violation that was
not there (a read of a value nobody wrote).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["CheckResult", "Operation", "check", "check_key"]

OPS = ("put", "get", "cas", "delete")

_UNKNOWN = object()  # the result of an operation whose outcome is unknown


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One client operation. `value`: what put / cas write. `expected`: what cas
    compares against. `result`: what get returned (bytes | None) or whether cas
    succeeded (bool); ignored for put and delete, and when `complete` is None."""

    client: int
    op: str
    key: str
    value: bytes | None = None
    expected: bytes | None = None
    result: object = None
    invoke: int
    complete: int | None

    def describe(self) -> str:
        if self.op == "put":
            call = f"put({self.key!r}, {self.value!r})"
        elif self.op == "delete":
            call = f"delete({self.key!r})"
        elif self.op == "get":
            call = f"get({self.key!r})"
        else:
            call = f"cas({self.key!r}, {self.expected!r} -> {self.value!r})"
        if self.complete is None:
            return f"client {self.client}: {call} -> ? [invoke {self.invoke}, no completion]"
        shown = f" -> {self.result!r}" if self.op in ("get", "cas") else ""
        return f"client {self.client}: {call}{shown} [invoke {self.invoke}, complete {self.complete}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """`ok`: True (linearizable), False (not), None (unknown: the search bound was hit).
    `key` names the first key found non-linearizable (or unknown); `operations` is the
    shrunk counterexample for it."""

    ok: bool | None
    key: str | None
    explanation: str
    operations: tuple[Operation, ...] = ()


def _validate(op: Operation) -> None:
    where = f"operation {op!r:.200}"
    if op.op not in OPS:
        raise InvalidArgument(f"{where}: op must be one of {OPS}")
    if type(op.key) is not str:
        raise InvalidArgument(f"{where}: key must be a str")
    if type(op.invoke) is not int or (op.complete is not None and type(op.complete) is not int):
        raise InvalidArgument(f"{where}: invoke and complete are integers")
    if op.complete is not None and op.complete < op.invoke:
        raise InvalidArgument(f"{where}: completes before it is invoked")
    if op.op in ("put", "cas") and type(op.value) is not bytes:
        raise InvalidArgument(f"{where}: {op.op} needs a bytes value")
    if op.op == "cas" and op.expected is not None and type(op.expected) is not bytes:
        raise InvalidArgument(f"{where}: cas expected is bytes or None")
    if op.complete is not None:
        if op.op == "get" and op.result is not None and type(op.result) is not bytes:
            raise InvalidArgument(f"{where}: get's result is bytes or None")
        if op.op == "cas" and type(op.result) is not bool:
            raise InvalidArgument(f"{where}: cas's result is a bool")


def _step(state: bytes | None, op: Operation, result: object) -> tuple[bool, bytes | None]:
    """The sequential register: may `op` return `result` in `state`, and the state after."""
    kind = op.op
    if kind == "put":
        return True, op.value
    if kind == "delete":
        return True, None
    if kind == "get":
        return result == state, state
    # cas
    matches = state == op.expected
    if result is _UNKNOWN:
        return True, op.value if matches else state
    return result is matches, op.value if matches else state


def _search(
    ops: Sequence[Operation], initial: bytes | None, states_max: int
) -> tuple[bool | None, list[int]]:
    """Wing-Gong-Lowe search over one key's operations. Returns (verdict, the longest
    linearization found as operation indexes)."""
    n = len(ops)
    results = [_UNKNOWN if op.complete is None else op.result for op in ops]
    required = [op.complete is not None for op in ops]
    required_total = sum(required)

    # Events: (time, 0 = call / 1 = return, op index). Calls sort before returns at the
    # same time, so ties overlap. Unknown outcomes have no return event.
    events = [(op.invoke, 0, i) for i, op in enumerate(ops)]
    events += [(op.complete, 1, i) for i, op in enumerate(ops) if op.complete is not None]
    events.sort()
    # A doubly linked list over nodes 1..m (node 0 is the head; -1 ends the list).
    m = len(events)
    nxt = list(range(1, m + 1)) + [-1]
    nxt[m] = -1
    prv = [-1] + list(range(0, m))
    node_op = [-1] + [i for _, _, i in events]
    node_is_call = [False] + [kind == 0 for _, kind, _ in events]
    return_node = [-1] * n
    for node in range(1, m + 1):
        if not node_is_call[node]:
            return_node[node_op[node]] = node

    def unlink(node: int) -> None:
        nxt[prv[node]] = nxt[node]
        if nxt[node] != -1:
            prv[nxt[node]] = prv[node]

    def relink(node: int) -> None:
        nxt[prv[node]] = node
        if nxt[node] != -1:
            prv[nxt[node]] = node

    cache: set[tuple[int, bytes | None]] = set()
    stack: list[tuple[int, bytes | None]] = []  # (call node, state before it)
    state = initial
    linearized = 0
    done = 0
    best: list[int] = []
    best_done = -1
    node = nxt[0]
    while True:
        if done == required_total:
            return True, [node_op[c] for c, _ in stack]
        if node != -1 and node_is_call[node]:
            i = node_op[node]
            accepted, new_state = _step(state, ops[i], results[i])
            if accepted:
                new_linearized = linearized | (1 << i)
                if (new_linearized, new_state) not in cache:
                    if len(cache) >= states_max:
                        return None, best
                    cache.add((new_linearized, new_state))
                    stack.append((node, state))
                    state, linearized = new_state, new_linearized
                    done += required[i]
                    # Lift the call and its return out of the list (Knuth's dancing links).
                    unlink(node)
                    if return_node[i] != -1:
                        unlink(return_node[i])
                    if done > best_done:
                        best_done, best = done, [node_op[c] for c, _ in stack]
                    node = nxt[0]
                    continue
            node = nxt[node]
            continue
        # A return of an operation not yet linearized (or the end of the list): undo
        # the last choice and try the next candidate after it.
        if not stack:
            return False, best
        node, state = stack.pop()
        i = node_op[node]
        linearized &= ~(1 << i)
        done -= required[i]
        if return_node[i] != -1:
            relink(return_node[i])
        relink(node)
        node = nxt[node]


def _is_read_only(op: Operation) -> bool:
    return op.complete is not None and (op.op == "get" or (op.op == "cas" and op.result is False))


def check_key(
    ops: Sequence[Operation],
    *,
    initial: bytes | None = None,
    states_max: int = 1_000_000,
    shrink_ops_max: int = 200,
) -> CheckResult:
    """Check the operations of one key (see `check`)."""
    key = ops[0].key if ops else None
    # An unknown-outcome get constrains nothing.
    ops = sorted((op for op in ops if not (op.op == "get" and op.complete is None)), key=lambda o: (o.invoke, o.client))
    verdict, best = _search(ops, initial, states_max)
    if verdict is True:
        return CheckResult(ok=True, key=key, explanation=f"key {key!r}: {len(ops)} operations linearizable")
    if verdict is None:
        return CheckResult(
            ok=None,
            key=key,
            explanation=f"key {key!r}: unknown, the search passed states_max={states_max} with {len(ops)} operations",
            operations=tuple(ops),
        )
    # Shrink: drop read-only operations while the rest still cannot be linearized.
    kept = list(ops)
    if len(kept) <= shrink_ops_max:
        for op in sorted((o for o in ops if _is_read_only(o)), key=lambda o: -o.invoke):
            trial = [o for o in kept if o is not op]
            trial_verdict, trial_best = _search(trial, initial, states_max)
            if trial_verdict is False:
                kept, best = trial, trial_best
    lines = [f"key {key!r} is not linearizable; these {len(kept)} operations show it:"]
    lines += [f"  {op.describe()}" for op in kept]
    if best:
        lines.append("the longest linearizable order of them, after which no remaining operation fits:")
        lines += [f"  {kept[i].describe()}" for i in best]
    else:
        lines.append("no operation can be linearized first")
    return CheckResult(ok=False, key=key, explanation="\n".join(lines), operations=tuple(kept))


def check(
    history: Sequence[Operation],
    *,
    initial: Mapping[str, bytes] | None = None,
    states_max: int = 1_000_000,
    shrink_ops_max: int = 200,
) -> CheckResult:
    """Is `history` linearizable for a map of registers that start absent (or at
    `initial[key]`)? Keys are checked independently, in sorted order; the first
    violation is returned. `states_max` bounds each key's search (`ok=None` past it);
    counterexamples are shrunk for keys with at most `shrink_ops_max` operations."""
    by_key: dict[str, list[Operation]] = {}
    for op in history:
        _validate(op)
        by_key.setdefault(op.key, []).append(op)
    initial = initial or {}
    unknown: CheckResult | None = None
    for key in sorted(by_key):
        result = check_key(by_key[key], initial=initial.get(key), states_max=states_max, shrink_ops_max=shrink_ops_max)
        if result.ok is False:
            return result
        if result.ok is None and unknown is None:
            unknown = result
    if unknown is not None:
        return unknown
    return CheckResult(
        ok=True, key=None, explanation=f"linearizable: {len(history)} operations on {len(by_key)} keys"
    )
