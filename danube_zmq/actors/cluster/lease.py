"""The broker's registration lease and fencing, as a pure state machine.

The broker holds `/cluster/register/{id}` with a TTL (`cluster.lease_ttl_ms`), renewed
every third of it. The leader stamps a renewal when it applies it, after the broker sent
it, so a renewal sent at `sent_ms` and answered keeps the lease until at least
`sent_ms + ttl`; the broker serves until a sixth of the TTL before that (the margin
leaves time to unload), and when renewals keep failing it stops serving at that time,
before the load manager can give its topics to another broker (fencing). When a
renewal succeeds again it serves again.

`step(lease, event) -> (lease, actions)`: no I/O, no clock; times are monotonic
milliseconds carried by the events. The shell (`lease_keeper.py`) turns timer messages
into `Tick`s, runs the `Renew` actions against the metadata store and feeds their
outcome back; `Serve` and `StopServing` go to the broker.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Lease", "Renew", "RenewalFailed", "Renewed", "Serve", "StopServing", "Tick", "step"]


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: the shell's timer fired at `now_ms`."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class Renewed:
    """The renewal sent at `sent_ms` was applied; the answer came at `now_ms`."""

    sent_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class RenewalFailed:
    """The renewal sent at `sent_ms` failed or timed out (answer at `now_ms`)."""

    sent_ms: int
    now_ms: int


Event = Tick | Renewed | RenewalFailed


@dataclass(frozen=True, slots=True)
class Renew:
    """Send a renewal now; its outcome comes back as `Renewed`/`RenewalFailed(sent_ms)`."""

    sent_ms: int


@dataclass(frozen=True, slots=True)
class Serve:
    """Serve (again, or for longer) until `until_ms`, never at or after it."""

    until_ms: int


@dataclass(frozen=True, slots=True)
class StopServing:
    """The lease may run out: unload everything before another broker can take it."""


Action = Renew | Serve | StopServing


@dataclass(frozen=True, slots=True)
class Lease:
    ttl_ms: int
    held: bool = False
    until_ms: int = 0  # serving only while now < until_ms
    sent_ms: int | None = None  # the renewal in flight, unanswered
    next_renewal_ms: int = 0

    def __post_init__(self) -> None:
        assert self.ttl_ms >= 6, self.ttl_ms
        assert not self.held or self.until_ms > 0

    @property
    def margin_ms(self) -> int:
        """Served no closer than this to the lease's end: the unload's time."""
        return self.ttl_ms // 6

    @property
    def renew_every_ms(self) -> int:
        return self.ttl_ms // 3

    def wake_at_ms(self) -> int:
        """The next time a `Tick` can change anything."""
        times = [self.next_renewal_ms if self.sent_ms is None else self.sent_ms + self.ttl_ms]
        if self.held:
            times.append(self.until_ms)
        return min(times)


def step(lease: Lease, event: Event) -> tuple[Lease, list[Action]]:
    actions: list[Action] = []
    now = event.now_ms
    if isinstance(event, Renewed):
        # A late answer counts too: the lease it took cannot end before sent + ttl.
        until = max(lease.until_ms, event.sent_ms + lease.ttl_ms - lease.margin_ms)
        if until > lease.until_ms and now < until:
            actions.append(Serve(until_ms=until))
            lease = dataclasses.replace(lease, held=True, until_ms=until)
        else:
            lease = dataclasses.replace(lease, until_ms=until)
    if isinstance(event, Renewed | RenewalFailed) and lease.sent_ms == event.sent_ms:
        lease = dataclasses.replace(lease, sent_ms=None)
    if lease.sent_ms is not None and now >= lease.sent_ms + lease.ttl_ms:
        lease = dataclasses.replace(lease, sent_ms=None)  # never answered: the next one goes
    if lease.held and now >= lease.until_ms:
        lease = dataclasses.replace(lease, held=False)
        actions.append(StopServing())
    if lease.sent_ms is None and now >= lease.next_renewal_ms:
        lease = dataclasses.replace(lease, sent_ms=now, next_renewal_ms=now + lease.renew_every_ms)
        actions.append(Renew(sent_ms=now))
    assert not lease.held or now < lease.until_ms
    return lease, actions
