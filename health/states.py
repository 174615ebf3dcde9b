"""A proxy's health state and the rules that move it (health/engine.py's
"State" paragraph): consecutive failures and successes against thresholds,
the latency's moving average, the bounded probe history, the listener told
of every change.  Apart from the engine's scheduling, so each reads alone."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from health.metrics import HealthMetrics
from health.model import HISTORY, Health, HealthListener, Outcome, ProxyEndpoint, ProxyHealth
from health.probe import ProbeResult

log = logging.getLogger("health")

# Probes the prober could not run (Outcome.LOCAL) are logged at most this often.
_LOCAL_WARNING_EVERY_S = 10.0


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True, eq=False)
class ProxyState:
    """One proxy's state.  A changed endpoint gets a new object, so a probe
    of the old address finds itself stale by identity and is ignored."""

    endpoint: ProxyEndpoint
    changed_at: datetime = field(default_factory=_now)
    health: Health = Health.UNKNOWN
    failures: int = 0  # consecutive
    successes: int = 0  # consecutive
    latency_ms: float | None = None
    last_error: str | None = None
    probes: int = 0
    recent: tuple[float | None, ...] = ()

    def snapshot(self) -> ProxyHealth:
        return ProxyHealth(
            self.endpoint.name,
            self.health,
            self.latency_ms,
            self.last_error,
            self.changed_at,
            self.recent,
        )

    def remember(self, ms: float | None) -> None:
        """One more probe in the bounded history."""
        kept = self.recent if len(self.recent) < HISTORY else self.recent[1:]
        self.recent = (*kept, None if ms is None else round(ms, 1))


class StateRules:
    """Applies probe results and reports to proxies' states."""

    def __init__(
        self,
        *,
        fail_threshold: int,
        ok_threshold: int,
        latency_alpha: float,
        metrics: HealthMetrics,
        listener: HealthListener | None,
    ) -> None:
        self._fail_threshold = fail_threshold
        self._ok_threshold = ok_threshold
        self._alpha = latency_alpha
        self._metrics = metrics
        self._listener = listener
        self._local_failures = 0  # probes not run since the last warning
        self._local_warned_at = float("-inf")

    def record(self, proxy: ProxyState, result: ProbeResult, counted: bool, now: float) -> bool:
        """One probe's RESULT for PROXY (NOW: the loop's time); True when it
        counted for the proxy (not the prober's own shortage, and not a probe
        whose every target is down)."""
        metrics = self._metrics
        if result.outcome is Outcome.LOCAL:
            # Our own shortage (no file descriptor): nothing learnt about the proxy.
            metrics.probes[Outcome.LOCAL].inc()
            self._local_failure(proxy, result, now)
            return False
        if not counted:
            # Every target it tried is down: the fleet-wide failure is the
            # targets', not this proxy's (health/targets.py).
            metrics.probes[result.outcome].inc()
            metrics.targets_down_probes.inc()
            return False
        proxy.probes += 1
        metrics.probes[result.outcome].inc()
        for phase, ms in (
            ("connect", result.connect_ms),
            ("answer", result.answer_ms),
            ("tls", result.tls_ms),
        ):
            if ms is not None:
                metrics.latency[phase].observe(ms / 1000.0)
        if not result.ok:
            proxy.remember(None)
            self.failure(proxy, f"{result.outcome.value}: {result.error}")
            return True
        total = result.total_ms
        proxy.remember(total)
        if total is not None:
            metrics.latency["total"].observe(total / 1000.0)
            previous = proxy.latency_ms
            proxy.latency_ms = (
                total if previous is None else previous + self._alpha * (total - previous)
            )
        proxy.failures = 0
        proxy.successes = min(proxy.successes + 1, self._ok_threshold)
        if proxy.health is not Health.HEALTHY and proxy.successes >= self._ok_threshold:
            self._change(proxy, Health.HEALTHY)
        return True

    def _local_failure(self, proxy: ProxyState, result: ProbeResult, now: float) -> None:
        self._local_failures += 1
        if now - self._local_warned_at < _LOCAL_WARNING_EVERY_S:
            return
        log.warning(
            "%d probe(s) not run (%s), the last of %s; not counted against the proxies",
            self._local_failures,
            result.error,
            proxy.endpoint.name,
        )
        self._local_failures = 0
        self._local_warned_at = now

    def failure(self, proxy: ProxyState, error: str) -> None:
        proxy.last_error = error
        proxy.successes = 0
        proxy.failures = min(proxy.failures + 1, self._fail_threshold)
        if proxy.health is not Health.UNHEALTHY and proxy.failures >= self._fail_threshold:
            self._change(proxy, Health.UNHEALTHY)

    def _change(self, proxy: ProxyState, health: Health) -> None:
        self._metrics.proxies[proxy.health].dec()
        self._metrics.proxies[health].inc()
        # A proxy turning healthy at start-up is routine (thousands at once);
        # losing or regaining health is what an operator looks for.
        level = logging.DEBUG if Health.UNHEALTHY not in (proxy.health, health) else logging.INFO
        log.log(
            level,
            "proxy %s: %s -> %s%s",
            proxy.endpoint.name,
            proxy.health.value,
            health.value,
            f" ({proxy.last_error})" if health is Health.UNHEALTHY else "",
        )
        proxy.health = health
        proxy.changed_at = _now()
        self.notify(proxy.endpoint.name, health)

    def notify(self, name: str, health: Health) -> None:
        if self._listener is None:
            return
        try:
            self._listener.on_health_change(name, health)
        except Exception:
            # The lease store's trouble must not stop the probing of the fleet.
            log.exception("health listener failed for %s -> %s", name, health.value)
