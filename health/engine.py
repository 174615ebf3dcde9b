"""The health engine: every proxy of the fleet probed on a schedule.

One scheduler task on the caller's event loop keeps a heap of due times and
starts a probe task whenever a proxy is due and one of `workers` slots is
free, so no more than `workers` probes are ever in flight.  There is no
thread or process per probe.

Schedule.  A new proxy is probed at once.  Its second probe lands at a
uniformly random point of the following interval, which spreads a fleet that
arrived all at once (service start) evenly over the interval; after that the
period is `interval * (1 - jitter * U[0, 1))`, so the phases keep drifting
apart but no proxy waits longer than `interval` (when capacity allows) plus
one tick.  Time is counted from the start of the previous probe; a proxy
never has two scheduled probes in flight.  The scheduler sleeps a tick
(`interval / 100`, at most TICK_S) past the next due time and then starts
every proxy due by then: at thousands of probes a second the probes of a
tick share one wake-up of the loop and one poll of their sockets, where one
wake-up per probe cost more than the probe itself (bench/health_probes.py).

State.  A proxy starts unknown; `fail_threshold` consecutive failures make it
unhealthy, `ok_threshold` consecutive successes healthy.  A probe the prober
could not run for its own shortage (Outcome.LOCAL: out of file descriptors)
counts neither way: it is logged and counted in `egress_health_probes`.
Latency is an exponentially weighted moving average of successful probes;
the last HISTORY probes' times (None for a failure) are kept too, as a tuple
that each probe replaces, so a snapshot shares it without copying.
The listener hears every change of health, synchronously, on the loop.
These rules live in health/states.py; this module schedules and probes.

Targets.  A probe tries the configured targets in turn until one is reached;
a probe that reaches none while every target it tried looks down across the
fleet counts neither way (health/targets.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import random
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry

from health.metrics import HealthMetrics
from health.model import Health, HealthListener, Outcome, ProxyEndpoint, ProxyHealth
from health.probe import ProbeFn, ProbeResult, probe
from health.states import ProxyState, StateRules
from health.targets import ProbeTargets, missed_target

log = logging.getLogger("health")

# Due time of a proxy that must be probed at once: before every real time.
_AT_ONCE = float("-inf")
# Longest a due probe waits so that it starts with the others due by then.
TICK_S = 0.01


class HealthEngine:
    def __init__(
        self,
        *,
        target: str | Sequence[str],
        interval: float = 10.0,
        workers: int = 256,
        timeout: float = 5.0,
        fail_threshold: int = 2,
        ok_threshold: int = 1,
        jitter: float = 0.1,
        tls: bool = False,
        ca_file: str | None = None,
        listener: HealthListener | None = None,
        registry: CollectorRegistry | None = None,
        probe_fn: ProbeFn = probe,
        latency_alpha: float = 0.3,
    ) -> None:
        _require(interval > 0, f"interval must be positive, got {interval!r}")
        _require(timeout > 0, f"timeout must be positive, got {timeout!r}")
        _require(workers >= 1, f"workers must be at least 1, got {workers!r}")
        _require(fail_threshold >= 1, f"fail_threshold must be at least 1, got {fail_threshold!r}")
        _require(ok_threshold >= 1, f"ok_threshold must be at least 1, got {ok_threshold!r}")
        _require(0 <= jitter < 1, f"jitter must be in [0, 1), got {jitter!r}")
        _require(0 < latency_alpha <= 1, f"latency_alpha must be in (0, 1], got {latency_alpha!r}")
        # Tried in turn until one is reached (health/targets.py).
        self._targets = ProbeTargets((target,) if isinstance(target, str) else target, interval)
        self._interval = interval
        self._timeout = timeout
        self._jitter = jitter
        self._tls = tls
        self._ca_file = ca_file
        self._probe_fn = probe_fn
        self._tick = min(TICK_S, interval / 100)
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics = HealthMetrics(self.registry, lambda: self._in_flight)
        for name in self._targets.targets:
            self._metrics.target_down(name, functools.partial(self._targets.is_down, name))
        self._rules = StateRules(
            fail_threshold=fail_threshold,
            ok_threshold=ok_threshold,
            latency_alpha=latency_alpha,
            metrics=self._metrics,
            listener=listener,
        )
        self._proxies: dict[str, ProxyState] = {}
        self._changed: dict[str, ProxyState] = {}  # probed or reported since take_changed()
        # (due loop time, tie-breaker, proxy); entries of removed or replaced
        # proxies stay until they surface and are dropped then.
        self._due: list[tuple[float, int, ProxyState]] = []
        self._order = itertools.count()
        self._slots = asyncio.Semaphore(workers)
        self._wake = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._rng = random.Random()

    # -- the fleet -------------------------------------------------------------------

    def set_fleet(self, endpoints: Iterable[ProxyEndpoint]) -> None:
        """Replace the fleet.  New proxies start unknown and are probed at once;
        removed ones are no longer probed; a proxy whose address or credentials
        changed starts over as unknown (what was known was about the old one),
        and the listener hears of that.  Call it on the engine's loop thread."""
        wanted: dict[str, ProxyEndpoint] = {}
        for endpoint in endpoints:
            if endpoint.name in wanted:
                raise ValueError(f"proxy {endpoint.name!r} appears twice in the fleet")
            wanted[endpoint.name] = endpoint
        removed = [self._proxies[name] for name in self._proxies.keys() - wanted.keys()]
        for proxy in removed:
            self._metrics.proxies[proxy.health].dec()
            log.debug("proxy %s left the fleet (was %s)", proxy.endpoint.name, proxy.health.value)
        fleet: dict[str, ProxyState] = {}
        added = changed = 0
        forgotten: list[str] = []  # known before, unknown now: the listener must hear it
        for name, endpoint in wanted.items():
            current = self._proxies.get(name)
            if current is not None and current.endpoint == endpoint:
                fleet[name] = current
                continue
            fleet[name] = proxy = ProxyState(endpoint)
            self._metrics.proxies[Health.UNKNOWN].inc()
            self._push(_AT_ONCE, proxy)
            if current is None:
                added += 1
                log.debug("proxy %s added (%s:%d)", name, endpoint.host, endpoint.port)
                continue
            changed += 1
            self._metrics.proxies[current.health].dec()
            log.info("proxy %s changed address or credentials; probing it again", name)
            if current.health is not Health.UNKNOWN:
                forgotten.append(name)
        self._proxies = fleet
        if added or changed or removed:
            log.info(
                "fleet: %d proxies, %d added, %d changed, %d removed",
                len(fleet),
                added,
                changed,
                len(removed),
            )
        for name in forgotten:
            self._rules.notify(name, Health.UNKNOWN)

    def _push(self, due: float, proxy: ProxyState) -> None:
        heapq.heappush(self._due, (due, next(self._order), proxy))
        if self._due[0][2] is proxy:
            self._wake.set()  # earlier than what the scheduler sleeps towards

    def _current(self, proxy: ProxyState) -> bool:
        return self._proxies.get(proxy.endpoint.name) is proxy

    # -- reading state ---------------------------------------------------------------

    def health(self, name: str) -> ProxyHealth | None:
        proxy = self._proxies.get(name)
        return proxy.snapshot() if proxy is not None else None

    def verdict(self, name: str) -> Health | None:
        """The proxy's health alone: what a grant checks for each candidate,
        without building a snapshot."""
        proxy = self._proxies.get(name)
        return proxy.health if proxy is not None else None

    def all(self) -> list[ProxyHealth]:
        """Every proxy, in fleet order."""
        return [proxy.snapshot() for proxy in self._proxies.values()]

    def take_changed(self) -> list[ProxyHealth]:
        """The proxies probed or reported since the last call (in the fleet
        still), as all() gives them: for a copy of the state kept elsewhere
        (the PostgreSQL prober's writes), which all() at every round would
        cost a snapshot of the whole fleet."""
        changed, self._changed = self._changed, {}
        return [proxy.snapshot() for proxy in changed.values() if self._current(proxy)]

    def probe_targets(self) -> list[tuple[str, bool]]:
        """Each probe target, in the configured order, and whether it looks down."""
        return [(target, self._targets.is_down(target)) for target in self._targets.targets]

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def probe_count(self, name: str) -> int:
        """Probes of this proxy whose results counted (0 for unknown names)."""
        proxy = self._proxies.get(name)
        return proxy.probes if proxy is not None else 0

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start probing on the running event loop (idempotent)."""
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.get_running_loop().create_task(
                self._schedule(), name="health-scheduler"
            )

    async def stop(self) -> None:
        """Stop the scheduler and cancel probes in flight; state is kept."""
        tasks = [*self._tasks]
        if self._scheduler is not None:
            tasks.append(self._scheduler)
            self._scheduler = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- probing ---------------------------------------------------------------------

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_stale()
            if not self._due:
                await self._sleep(None)
                continue
            wait = self._due[0][0] - loop.time()
            if wait > 0:
                await self._sleep(wait + self._tick)
                continue
            await self._slots.acquire()
            # The heap may have changed while waiting for a slot.
            self._drop_stale()
            if not self._due or self._due[0][0] > loop.time():
                self._slots.release()
                continue
            due, _, proxy = heapq.heappop(self._due)
            if due != _AT_ONCE:
                self._metrics.schedule_lag.set(max(0.0, loop.time() - due))
            task = loop.create_task(self._scheduled_probe(proxy))
            self._tasks.add(task)
            # A done callback, not a finally: a task cancelled before its
            # first step never runs its body, and its slot must come back.
            task.add_done_callback(functools.partial(self._probe_done, proxy))

    def _probe_done(self, proxy: ProxyState, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if task.cancelled():
            if self._current(proxy):
                # Cancelled by stop(): the proxy's next probe was never scheduled.
                self._push(_AT_ONCE, proxy)
            return
        if (error := task.exception()) is not None:
            # A bug after the probe (nothing here is meant to raise): keep the
            # proxy on the schedule rather than silently dropping it.
            log.error("probing %s failed", proxy.endpoint.name, exc_info=error)
            if self._current(proxy):
                self._push(asyncio.get_running_loop().time() + self._interval, proxy)

    def _drop_stale(self) -> None:
        while self._due and not self._current(self._due[0][2]):
            heapq.heappop(self._due)

    async def _sleep(self, seconds: float | None) -> None:
        """Until `seconds` pass or the heap gets an earlier entry."""
        self._wake.clear()
        if seconds is None:
            await self._wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _scheduled_probe(self, proxy: ProxyState) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result, counted = await self._call_probe(proxy)
        if not self._current(proxy):
            return  # removed or replaced while the probe ran
        first = proxy.probes == 0
        self._record(proxy, result, counted)
        if first:
            period = self._interval * self._rng.random()
        else:
            period = self._interval * (1.0 - self._jitter * self._rng.random())
        self._push(started + period, proxy)

    async def _call_probe(self, proxy: ProxyState) -> tuple[ProbeResult, bool]:
        """The probe's result, and whether it counts for the proxy: the
        targets in turn until one is reached or the proxy fails for itself;
        when none is reached, the first target's answer, not counted if every
        target tried is down (health/targets.py)."""
        loop = asyncio.get_running_loop()
        first: ProbeResult | None = None
        tried: list[str] = []
        order, trials = self._targets.order(loop.time())
        try:
            for target in order:
                result = await self._attempt(proxy, target)
                if result.outcome is Outcome.LOCAL:
                    return result, True  # record() leaves it out
                missed = missed_target(result)
                if result.ok or missed:  # says something about the target
                    self._targets.record(target, loop.time(), not missed, result.error)
                if not missed:
                    return result, True
                if first is None:
                    first = result
                tried.append(target)
        finally:
            self._targets.end_trials(trials)
        assert first is not None
        return first, not all(self._targets.is_down(target) for target in tried)

    async def _attempt(self, proxy: ProxyState, target: str) -> ProbeResult:
        self._in_flight += 1
        try:
            return await self._probe_fn(
                proxy.endpoint,
                target,
                timeout=self._timeout,
                tls=self._tls,
                ca_file=self._ca_file,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug in a probe must not stop the engine; the proxy fails.
            log.exception("probe of %s crashed", proxy.endpoint.name)
            return ProbeResult(Outcome.ERROR, None, None, None, None, f"probe crashed: {exc!r}")
        finally:
            self._in_flight -= 1

    async def probe_now(self, name: str) -> ProxyHealth:
        """Probe one proxy now (within the worker bound) and count the result.
        KeyError for a name not in the fleet."""
        proxy = self._proxies.get(name)
        if proxy is None:
            raise KeyError(name)
        async with self._slots:
            result, counted = await self._call_probe(proxy)
        if self._current(proxy):
            self._record(proxy, result, counted)
        return proxy.snapshot()

    def report_error(self, name: str, error: str) -> None:
        """A crawler's `error` report: one failed probe.  Unknown names are
        ignored (the proxy may have left the fleet while leased)."""
        proxy = self._proxies.get(name)
        if proxy is None:
            return
        self._metrics.reported_errors.inc()
        self._changed[name] = proxy
        self._rules.failure(proxy, f"reported by a crawler: {error}")

    def _record(self, proxy: ProxyState, result: ProbeResult, counted: bool) -> None:
        now = asyncio.get_running_loop().time()
        if self._rules.record(proxy, result, counted, now):
            self._changed[proxy.endpoint.name] = proxy


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
