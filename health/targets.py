"""Several probe targets, and a target that is down told from a fleet that is.

With one target, that target's outage reads as the whole fleet's: every squid
answers 502/503/504 (or nothing) for it, every proxy turns unhealthy and
grants answer 409 fleet-wide until the target is back.  Two things prevent
that here:

- **Fallback.**  A probe tries the targets in order; when a proxy answers
  but could not reach a target (:func:`missed_target`), the next one is
  tried.  One target reached proves the proxy works.
- **A target judged down.**  Each target keeps a window of its recent
  attempts (one probe interval).  When at least MIN_ATTEMPTS of them tried
  it and DOWN_SHARE or more could not reach it, the target is down: tried
  last from then on, and a probe whose every target missed is not counted
  against the proxy when all the targets it tried are down.  That is the
  fleet-wide failure read as the target's (as a load balancer's panic mode
  stops trusting health checks that fail everywhere at once); a proxy that
  really lost its way out is still found by crawlers' `error` reports, which
  always count.  A down target keeps being tried first whenever its window
  has fewer than MIN_ATTEMPTS attempts, so its recovery is seen within an
  interval.

Times are the caller's (the engine's loop time), so tests run on a virtual
clock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from health.model import Outcome
from health.probe import ProbeResult, check_target

log = logging.getLogger("health")

# Fewer attempts than this in a window say nothing about the target: a small
# fleet cannot tell its target down from all its proxies cut off.
MIN_ATTEMPTS = 5
# At least this share of a window's attempts missed: the target is down.
DOWN_SHARE = 0.9
# A window is one probe interval, counted in this many buckets.
BUCKETS = 10


def missed_target(result: ProbeResult) -> bool:
    """The proxy answered but could not reach the target: squid's 502/503/504,
    a TLS handshake with the target that failed, or a time-out once the proxy
    took the connection (squid still trying the target, or the target slow to
    finish its handshake through the tunnel)."""
    if result.outcome in (Outcome.UPSTREAM, Outcome.TLS):
        return True
    return result.outcome is Outcome.TIMEOUT and result.connect_ms is not None


def given_twice(targets: Sequence[str]) -> str | None:
    """The first (in sorted order) of TARGETS given more than once, if any."""
    twice = sorted({target for target in targets if targets.count(target) > 1})
    return twice[0] if twice else None


@dataclass(slots=True)
class _Window:
    """Attempts at one target over the last BUCKETS buckets of `width` seconds."""

    width: float
    reached: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    missed: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    epochs: list[int] = field(default_factory=lambda: [-1] * BUCKETS)

    def add(self, now: float, reached: bool) -> None:
        epoch = int(now // self.width)
        slot = epoch % BUCKETS
        if self.epochs[slot] != epoch:
            self.epochs[slot] = epoch
            self.reached[slot] = self.missed[slot] = 0
        if reached:
            self.reached[slot] += 1
        else:
            self.missed[slot] += 1

    def counts(self, now: float) -> tuple[int, int]:
        """(missed, attempts) in the window ending at NOW."""
        oldest = int(now // self.width) - BUCKETS + 1
        missed = attempts = 0
        for slot in range(BUCKETS):
            if self.epochs[slot] >= oldest:
                missed += self.missed[slot]
                attempts += self.missed[slot] + self.reached[slot]
        return missed, attempts


class ProbeTargets:
    """The configured targets, in order, and which of them are down."""

    def __init__(self, targets: Sequence[str], window: float) -> None:
        if not targets:
            raise ValueError("at least one probe target is needed")
        for target in targets:
            check_target(target)
        twice = given_twice(targets)
        if twice is not None:
            raise ValueError(f"probe target {twice!r} is given twice")
        self.targets: tuple[str, ...] = tuple(targets)
        self._windows = {target: _Window(window / BUCKETS) for target in self.targets}
        self._down: set[str] = set()
        # Down targets' attempts in flight as trials: a target that never
        # answers (packets dropped) holds each attempt for the whole timeout,
        # and the probes starting meanwhile must not all try it first too.
        self._trials: dict[str, int] = dict.fromkeys(self.targets, 0)

    def is_down(self, target: str) -> bool:
        return target in self._down

    def order(self, now: float) -> tuple[list[str], list[str]]:
        """The targets to try, in turn: those up first, then those down, but
        a down target whose window holds too few attempts to judge it (its
        trials in flight counted) goes first, as a trial: the fleet's next
        probes find out whether it is back. The trials, second, must be
        handed to end_trials() once the probe is over."""
        if not self._down:
            return list(self.targets), []
        trials = [
            target
            for target in self._down
            if self._windows[target].counts(now)[1] + self._trials[target] < MIN_ATTEMPTS
        ]
        for target in trials:
            self._trials[target] += 1
        first = [t for t in self.targets if t not in self._down or t in trials]
        return first + [t for t in self.targets if t not in first], trials

    def end_trials(self, trials: list[str]) -> None:
        for target in trials:
            self._trials[target] -= 1

    def record(self, target: str, now: float, reached: bool, error: str | None = None) -> None:
        """One attempt at TARGET; judges it again (logging a change)."""
        window = self._windows[target]
        window.add(now, reached)
        if reached and target not in self._down:
            return  # nothing to judge: the common case, kept cheap
        missed, attempts = window.counts(now)
        if attempts < MIN_ATTEMPTS:
            return
        down = missed >= DOWN_SHARE * attempts
        if down == (target in self._down):
            return
        if down:
            self._down.add(target)
            log.warning(
                "probe target %s looks down: %d of the last %d attempts could not reach it "
                "(%s); probes that reach no target are not counted against the proxies "
                "while every target they tried is down",
                target,
                missed,
                attempts,
                error,
            )
        else:
            self._down.discard(target)
            log.info(
                "probe target %s reachable again (%d of %d attempts reached it)",
                target,
                attempts - missed,
                attempts,
            )
