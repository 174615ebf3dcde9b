"""The health engine's Prometheus metrics, on the registry the service exports.

No per-proxy labels: a fleet has thousands of proxies, and per-proxy detail is
what `GET /v1/proxies` is for.  Label children are looked up once here, not on
every probe, because `.labels()` takes a lock and builds a key each call.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from health.model import Health, Outcome

# From a loopback answer (~0.1 ms) to the default 5 s probe timeout.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
PHASES = ("connect", "answer", "tls", "total")


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry, in_flight: Callable[[], float]) -> None:
        latency = Histogram(
            "egress_health_probe_latency_seconds",
            "Time of each completed probe phase (connect, CONNECT answer, TLS) and of "
            "the whole successful probe (total)",
            ["phase"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        probes = Counter(
            "egress_health_probes",
            "Probes by how they ended (local: not run for the prober's own shortage of file "
            "descriptors, not counted against the proxy)",
            ["outcome"],
            registry=registry,
        )
        proxies = Gauge(
            "egress_health_proxies",
            "Proxies of the fleet by health state",
            ["state"],
            registry=registry,
        )
        self.latency = {phase: latency.labels(phase=phase) for phase in PHASES}
        self.probes = {outcome: probes.labels(outcome=outcome.value) for outcome in Outcome}
        self.proxies = {health: proxies.labels(state=health.value) for health in Health}
        self.reported_errors = Counter(
            "egress_health_reported_errors",
            "Errors reported by crawlers, each counted as a failed probe",
            registry=registry,
        )
        # Read at scrape time: an inc/dec pair per probe would take the lock twice.
        self.in_flight = Gauge(
            "egress_health_probes_in_flight",
            "Probes running right now (at most the number of health workers)",
            registry=registry,
        )
        self.in_flight.set_function(in_flight)
        self._target_down = Gauge(
            "egress_health_probe_target_down",
            "1 while a probe target looks down (most attempts through the fleet could not "
            "reach it), else 0",
            ["target"],
            registry=registry,
        )
        self.targets_down_probes = Counter(
            "egress_health_probes_targets_down",
            "Probes that reached no target while every target they tried looked down: "
            "not counted against the proxy",
            registry=registry,
        )
        self.schedule_lag = Gauge(
            "egress_health_schedule_lag_seconds",
            "How late the most recently started probe was against its schedule; "
            "growing lag means the fleet needs more workers or a longer interval",
            registry=registry,
        )

    def target_down(self, target: str, is_down: Callable[[], bool]) -> None:
        """TARGET's gauge, read at scrape time."""
        self._target_down.labels(target=target).set_function(lambda: float(is_down()))
